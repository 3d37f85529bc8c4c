// TurboJPEG wrappers and the crop/resample transforms.
#include "shuffle/image.hpp"

#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "shuffle/rng.hpp"

namespace gg::shuffle {

namespace {

// Uniform double in [lo, hi) from 53 random bits.
double uniform(std::mt19937_64& rng, double lo, double hi) {
  return lo + (hi - lo) * static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

// Python's round(): halves to even, which std::nearbyint does in the default rounding mode.
int py_round(double v) { return static_cast<int>(std::nearbyint(v)); }

}  // namespace

CropBox RandomResizedCrop::sample(int width, int height, std::mt19937_64& rng) const {
  const double area = static_cast<double>(width) * height;
  const double log_lo = std::log(ratio_min), log_hi = std::log(ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * uniform(rng, scale_min, scale_max);
    const double aspect = std::exp(uniform(rng, log_lo, log_hi));
    const int w = py_round(std::sqrt(target * aspect));
    const int h = py_round(std::sqrt(target / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const auto y = static_cast<int>(uniform_below(rng, static_cast<uint64_t>(height - h) + 1));
      const auto x = static_cast<int>(uniform_below(rng, static_cast<uint64_t>(width - w) + 1));
      return {static_cast<double>(x), static_cast<double>(y), static_cast<double>(w),
              static_cast<double>(h)};
    }
  }
  const double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < ratio_min) {
    h = py_round(w / ratio_min);
  } else if (in_ratio > ratio_max) {
    w = py_round(h * ratio_max);
  }
  return {static_cast<double>((width - w) / 2), static_cast<double>((height - h) / 2),
          static_cast<double>(w), static_cast<double>(h)};
}

CropBox center_crop_box(int width, int height, int resize, int crop) {
  const double s = static_cast<double>(resize) / std::min(width, height);
  const double cw = std::min<double>(crop / s, width), ch = std::min<double>(crop / s, height);
  return {(width - cw) / 2, (height - ch) / 2, cw, ch};
}

namespace {

std::string megapixels(int64_t pixels) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(pixels) / 1e6);
  return buf;
}

std::string mebibytes(int64_t bytes) { return std::to_string((bytes + (1 << 20) - 1) >> 20); }

}  // namespace

bool read_jpeg_frame(const uint8_t* data, size_t size, JpegFrame& frame, std::string* error) {
  const auto fail = [&](const std::string& why) {
    if (error) *error = why;
    return false;
  };
  if (size < 4 || data[0] != 0xFF || data[1] != 0xD8) return fail("not a JPEG (no SOI marker)");
  // Marker syntax as libjpeg reads it: bytes other than 0xFF between segments are skipped (it warns
  // about them), fill bytes 0xFF before a marker code too, FF00 is not a marker.
  struct Component {
    int h, v;
  };
  std::vector<Component> comps;
  bool progressive = false;
  size_t p = 2;
  while (true) {
    while (p < size && data[p] != 0xFF) ++p;
    while (p < size && data[p] == 0xFF) ++p;
    if (p >= size) return fail("ends before its first scan (no SOS marker)");
    const uint8_t code = data[p++];
    if (code == 0x00 || code == 0x01 || (code >= 0xD0 && code <= 0xD7)) continue;  // no length
    if (code == 0xD8 || code == 0xD9)
      return fail(code == 0xD8 ? "a second SOI marker before the first scan"
                               : "ends (EOI) before its first scan");
    if (size - p < 2) return fail("truncated inside a marker");
    const size_t len = (size_t{data[p]} << 8) | data[p + 1];
    if (len < 2 || len > size - p) return fail("truncated inside a marker segment");
    const uint8_t* seg = data + p + 2;
    const size_t n = len - 2;
    p += len;
    const bool sof = code >= 0xC0 && code <= 0xCF && code != 0xC4 && code != 0xC8 && code != 0xCC;
    if (sof) {
      if (!comps.empty()) return fail("two frame (SOF) markers");
      if (n < 6) return fail("a frame (SOF) marker too short");
      frame.height = (seg[1] << 8) | seg[2];
      frame.width = (seg[3] << 8) | seg[4];
      frame.components = seg[5];
      if (frame.width == 0 || frame.height == 0)
        return fail("declares an empty image of " + std::to_string(frame.width) + "x" +
                    std::to_string(frame.height) + " pixels");
      if (frame.components < 1 || frame.components > 4 || n < 6 + 3 * size_t{seg[5]})
        return fail("a frame (SOF) marker with " + std::to_string(frame.components) +
                    " components");
      for (int c = 0; c < frame.components; ++c) {
        const int h = seg[7 + 3 * c] >> 4, v = seg[7 + 3 * c] & 15;
        if (h < 1 || h > 4 || v < 1 || v > 4) return fail("bad sampling factors in the frame");
        comps.push_back({h, v});
      }
      progressive = code == 0xC2 || code == 0xC6 || code == 0xCA || code == 0xCE;
    } else if (code == 0xDA) {
      if (comps.empty()) return fail("a scan (SOS) before the frame (SOF) marker");
      if (n < 1) return fail("a scan (SOS) marker too short");
      // A first scan without every component means more scans follow: libjpeg then buffers the
      // whole image, as it does for progressive files.
      frame.buffered = progressive || seg[0] < frame.components;
      int hmax = 1, vmax = 1;
      for (const Component& c : comps) {
        hmax = std::max(hmax, c.h);
        vmax = std::max(vmax, c.v);
      }
      frame.coefficient_bytes = 0;
      for (const Component& c : comps) {
        // Blocks of 8x8 samples (rounded up to whole MCUs), 64 coefficients of 2 bytes each.
        const int64_t bw = (static_cast<int64_t>(frame.width) * c.h + 8 * hmax - 1) / (8 * hmax);
        const int64_t bh = (static_cast<int64_t>(frame.height) * c.v + 8 * vmax - 1) / (8 * vmax);
        frame.coefficient_bytes += (bw + c.h - 1) / c.h * c.h * ((bh + c.v - 1) / c.v * c.v) * 128;
      }
      // Entropy-coded data never holds FF D9 (a data byte FF is written FF 00), so the image data
      // ends with its EOI marker unless the file was cut short (trailing bytes after it are fine).
      // Searched from the end, where it nearly always is.
      frame.complete = false;
      for (size_t q = size - 1; q > p && !frame.complete; --q)
        frame.complete = data[q - 1] == 0xFF && data[q] == 0xD9;
      return true;
    }
  }
}

JpegDecoder::JpegDecoder() : handle_(tjInitDecompress()) {
  if (handle_ == nullptr) throw std::runtime_error("TurboJPEG: cannot create a decompressor");
}

JpegDecoder::~JpegDecoder() { tjDestroy(static_cast<tjhandle>(handle_)); }

bool JpegDecoder::fail(const std::string& why, std::string* error) {
  if (error) *error = why;
  tjDestroy(static_cast<tjhandle>(handle_));
  handle_ = tjInitDecompress();
  if (handle_ == nullptr) throw std::runtime_error("TurboJPEG: cannot create a decompressor");
  return false;
}

bool JpegDecoder::header(const uint8_t* data, size_t size, int& width, int& height,
                         std::string* error) {
  int colorspace = 0;
  return read_header(data, size, width, height, colorspace, error);
}

bool JpegDecoder::read_header(const uint8_t* data, size_t size, int& width, int& height,
                              int& colorspace, std::string* error) {
  const auto h = static_cast<tjhandle>(handle_);
  width = height = 0;
  if (size == 0) return fail("empty file", error);
  if (size > 0xffffffffULL) return fail("larger than 4 GiB", error);
  int subsamp = 0;
  if (tjDecompressHeader3(h, data, static_cast<unsigned long>(size), &width, &height, &subsamp,
                          &colorspace) != 0)
    return fail(tjGetErrorStr2(h), error);
  JpegFrame f;
  std::string why;
  if (!read_jpeg_frame(data, size, f, &why)) return fail(why, error);
  if (f.width != width || f.height != height || width <= 0 || height <= 0)
    return fail("frame size " + std::to_string(f.width) + "x" + std::to_string(f.height) +
                    " disagrees with TurboJPEG's " + std::to_string(width) + "x" +
                    std::to_string(height),
                error);
  const int64_t pixels = static_cast<int64_t>(width) * height;
  const std::string dims = std::to_string(width) + "x" + std::to_string(height);
  if (pixels > kMaxJpegPixels)
    return fail("declares " + dims + " pixels (" + megapixels(pixels) +
                    " megapixels), above the decoder's limit of " + megapixels(kMaxJpegPixels) +
                    " megapixels",
                error);
  if (!f.complete)
    return fail("truncated: the image data has no end (EOI marker); premature end of the file",
                error);
  if (f.buffered && f.coefficient_bytes > kMaxJpegCoefficientBytes)
    return fail("progressive or multi-scan " + dims + " image: decoding it would hold " +
                    mebibytes(f.coefficient_bytes) + " MiB of coefficients, above the limit of " +
                    mebibytes(kMaxJpegCoefficientBytes) + " MiB",
                error);
  return true;
}

double JpegDecoder::decode(const uint8_t* data, size_t size, int channels, int min_width,
                           int min_height, Image& out, std::string* error) {
  out.width = out.height = out.channels = 0;
  out.pixels.clear();
  if (channels != 1 && channels != 3)
    throw std::invalid_argument("decode: channels must be 1 or 3");
  int width = 0, height = 0, colorspace = 0;
  if (!read_header(data, size, width, height, colorspace, error)) return 0;
  const auto h = static_cast<tjhandle>(handle_);
  // Keep the smallest scaling factor at which the image is still big enough.
  int count = 0;
  const tjscalingfactor* factors = tjGetScalingFactors(&count);
  tjscalingfactor best{1, 1};
  for (int i = 0; i < count; ++i) {
    const tjscalingfactor f = factors[i];
    // Only 1/2, 1/4 and 1/8: libjpeg-turbo has SIMD IDCTs for those, and the other M/8 scales
    // decode slower than the full image (measured: 6/8 at 0.8x the speed of 8/8).
    const bool fast =
        f.num == f.denom || (f.num == 1 && (f.denom == 2 || f.denom == 4 || f.denom == 8));
    if (!fast) continue;
    if (TJSCALED(width, f) >= min_width && TJSCALED(height, f) >= min_height &&
        f.num * best.denom < best.num * f.denom) {
      best = f;
    }
  }
  const int sw = TJSCALED(width, best), sh = TJSCALED(height, best);
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  const int format = cmyk ? TJPF_CMYK : (channels == 1 ? TJPF_GRAY : TJPF_RGB);
  const size_t n = static_cast<size_t>(sw) * sh;
  uint8_t* dst = nullptr;
  if (cmyk) {
    cmyk_.resize(n * 4);
    dst = cmyk_.data();
  } else {
    out.pixels.resize(n * channels);
    dst = out.pixels.data();
  }
  // Warnings (e.g. corrupt entropy data) still give an image, as they do in PIL; fatal errors and
  // truncation make the file corrupt: libjpeg fills the rows a truncated file lacks with grey,
  // which PIL refuses too ("image file is truncated"). Either way the handle starts afresh.
  if (tjDecompress2(h, data, static_cast<unsigned long>(size), dst, sw, 0, sh, format,
                    TJFLAG_FASTDCT) != 0) {
    const std::string why = tjGetErrorStr2(h);
    const bool fatal = tjGetErrorCode(h) == TJERR_FATAL || why == "Premature end of JPEG file";
    fail(why, fatal ? error : nullptr);
    if (fatal) {
      out.pixels.clear();
      return 0;
    }
  }
  if (cmyk) {
    // Adobe writes inverted CMYK: the ink is 255 - value, so RGB = value * K / 255.
    out.pixels.resize(n * channels);
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* p = cmyk_.data() + 4 * i;
      const int r = p[0] * p[3] / 255, g = p[1] * p[3] / 255, b = p[2] * p[3] / 255;
      if (channels == 1) {
        out.pixels[i] = static_cast<uint8_t>((299 * r + 587 * g + 114 * b + 500) / 1000);
      } else {
        out.pixels[3 * i] = static_cast<uint8_t>(r);
        out.pixels[3 * i + 1] = static_cast<uint8_t>(g);
        out.pixels[3 * i + 2] = static_cast<uint8_t>(b);
      }
    }
  }
  out.width = sw;
  out.height = sh;
  out.channels = channels;
  return static_cast<double>(sw) / width;
}

bool decode_to_chw(JpegDecoder& decoder, const uint8_t* data, size_t size, const JpegOptions& j,
                   bool augment, bool may_flip, std::mt19937_64& rng, Image& scratch, float* out,
                   std::string* error) {
  int w = 0, h = 0;
  if (!decoder.header(data, size, w, h, error)) return false;
  const CropBox box = augment ? j.rrc.sample(w, h, rng) : center_crop_box(w, h, j.resize, j.crop);
  const bool flip = may_flip && (rng() >> 63) != 0;
  // Decode just large enough that the box still covers crop x crop pixels.
  const int min_w = static_cast<int>(std::ceil(j.crop * static_cast<double>(w) / box.w));
  const int min_h = static_cast<int>(std::ceil(j.crop * static_cast<double>(h) / box.h));
  if (decoder.decode(data, size, j.channels, std::min(min_w, w), std::min(min_h, h), scratch,
                     error) == 0)
    return false;
  const double sx = static_cast<double>(scratch.width) / w;
  const double sy = static_cast<double>(scratch.height) / h;
  resample_to_chw(scratch, {box.x * sx, box.y * sy, box.w * sx, box.h * sy}, j.crop, j.crop, flip,
                  j.map, out);
  return true;
}

std::vector<uint8_t> encode_jpeg(const Image& img, int quality, bool progressive) {
  if (img.channels != 1 && img.channels != 3)
    throw std::invalid_argument("encode_jpeg: channels must be 1 or 3");
  if (img.width < 1 || img.height < 1 ||
      img.pixels.size() != static_cast<size_t>(img.width) * img.height * img.channels)
    throw std::invalid_argument("encode_jpeg: the pixels do not match the image size");
  tjhandle h = tjInitCompress();
  if (h == nullptr) throw std::runtime_error("TurboJPEG: cannot create a compressor");
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(h, img.pixels.data(), img.width, 0, img.height,
                             img.channels == 1 ? TJPF_GRAY : TJPF_RGB, &buf, &size,
                             img.channels == 1 ? TJSAMP_GRAY : TJSAMP_420, quality,
                             progressive ? TJFLAG_PROGRESSIVE : 0);
  std::string err = rc != 0 ? tjGetErrorStr2(h) : "";
  std::vector<uint8_t> out;
  if (rc == 0) out.assign(buf, buf + size);
  tjFree(buf);
  tjDestroy(h);
  if (rc != 0) throw std::runtime_error("TurboJPEG: encode failed: " + err);
  return out;
}

void resample_to_chw(const Image& img, const CropBox& box, int out_h, int out_w, bool flip,
                     const PixelMap& map, float* out) {
  const int C = img.channels, W = img.width, H = img.height;
  const auto positive = [](double v) { return std::isfinite(v) && v > 0; };
  if (C < 1 || C > 3 || W < 1 || H < 1 ||
      img.pixels.size() != static_cast<size_t>(W) * static_cast<size_t>(H) * C)
    throw std::invalid_argument("resample_to_chw: an image of " + std::to_string(W) + "x" +
                                std::to_string(H) + "x" + std::to_string(C) + " with " +
                                std::to_string(img.pixels.size()) + " pixel bytes");
  if (out_h < 1 || out_w < 1 || !std::isfinite(box.x) || !std::isfinite(box.y) ||
      !positive(box.w) || !positive(box.h))
    throw std::invalid_argument("resample_to_chw: an empty output or a degenerate crop box");
  // Source coordinate of output pixel centre o: box origin + (o + 0.5) * step - 0.5, clamped.
  struct Tap {
    int i0, i1;
    float w1;
  };
  const auto taps = [](double origin, double extent, int n, int limit) {
    std::vector<Tap> t(static_cast<size_t>(n));
    const double step = extent / n;
    for (int o = 0; o < n; ++o) {
      double s = origin + (o + 0.5) * step - 0.5;
      s = std::clamp(s, 0.0, static_cast<double>(limit - 1));
      const int i0 = static_cast<int>(s);
      const int i1 = std::min(i0 + 1, limit - 1);
      t[static_cast<size_t>(o)] = {i0, i1, static_cast<float>(s - i0)};
    }
    return t;
  };
  std::vector<Tap> tx = taps(box.x, box.w, out_w, W);
  const std::vector<Tap> ty = taps(box.y, box.h, out_h, H);
  if (flip) std::reverse(tx.begin(), tx.end());
  float scale[3], shift[3];
  for (int c = 0; c < C; ++c) {
    scale[c] = 1.f / (255.f * map.std[c]);
    shift[c] = -map.mean[c] / map.std[c];
  }
  // Horizontal pass once per source row the crop touches (two rows cached, planar), then a
  // contiguous vertical blend per output row that the compiler vectorises.
  const size_t plane = static_cast<size_t>(out_h) * out_w;
  std::vector<float> rows(static_cast<size_t>(2) * C * out_w);
  int cached[2] = {-1, -1};
  const auto horizontal = [&](int sy, int slot) {
    const uint8_t* src = img.pixels.data() + static_cast<size_t>(sy) * W * C;
    float* dst = rows.data() + static_cast<size_t>(slot) * C * out_w;
    for (int x = 0; x < out_w; ++x) {
      const Tap u = tx[static_cast<size_t>(x)];
      const uint8_t* a = src + static_cast<size_t>(u.i0) * C;
      const uint8_t* b = src + static_cast<size_t>(u.i1) * C;
      for (int c = 0; c < C; ++c) dst[c * out_w + x] = a[c] + u.w1 * (b[c] - a[c]);
    }
    cached[slot] = sy;
  };
  const auto row_of = [&](int sy, int avoid) -> const float* {
    for (int k = 0; k < 2; ++k)
      if (cached[k] == sy) return rows.data() + static_cast<size_t>(k) * C * out_w;
    const int slot = avoid == 0 ? 1 : 0;
    horizontal(sy, slot);
    return rows.data() + static_cast<size_t>(slot) * C * out_w;
  };
  for (int y = 0; y < out_h; ++y) {
    const Tap v = ty[static_cast<size_t>(y)];
    const float* r0 = row_of(v.i0, -1);
    const int slot0 = static_cast<int>((r0 - rows.data()) / (static_cast<ptrdiff_t>(C) * out_w));
    const float* r1 = row_of(v.i1, slot0);
    const float wy = v.w1;
    for (int c = 0; c < C; ++c) {
      const float* a = r0 + static_cast<size_t>(c) * out_w;
      const float* b = r1 + static_cast<size_t>(c) * out_w;
      float* dst = out + c * plane + static_cast<size_t>(y) * out_w;
      const float sc = scale[c], sh = shift[c];
      for (int x = 0; x < out_w; ++x) dst[x] = (a[x] + wy * (b[x] - a[x])) * sc + sh;
    }
  }
}

}  // namespace gg::shuffle
