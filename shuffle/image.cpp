// TurboJPEG wrappers and the crop/resample transforms.
#include "shuffle/image.hpp"

#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
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

JpegDecoder::JpegDecoder() : handle_(tjInitDecompress()) {
  if (handle_ == nullptr) throw std::runtime_error("TurboJPEG: cannot create a decompressor");
}

JpegDecoder::~JpegDecoder() { tjDestroy(static_cast<tjhandle>(handle_)); }

bool JpegDecoder::header(const uint8_t* data, size_t size, int& width, int& height,
                         std::string* error) {
  int subsamp = 0, colorspace = 0;
  if (size == 0 || size > 0xffffffffULL ||
      tjDecompressHeader3(static_cast<tjhandle>(handle_), data, static_cast<unsigned long>(size),
                          &width, &height, &subsamp, &colorspace) != 0) {
    if (error) *error = size == 0 ? "empty file" : tjGetErrorStr2(static_cast<tjhandle>(handle_));
    return false;
  }
  return true;
}

double JpegDecoder::decode(const uint8_t* data, size_t size, int channels, int min_width,
                           int min_height, Image& out, std::string* error) {
  const auto h = static_cast<tjhandle>(handle_);
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  if (size == 0 || size > 0xffffffffULL ||
      tjDecompressHeader3(h, data, static_cast<unsigned long>(size), &width, &height, &subsamp,
                          &colorspace) != 0) {
    if (error) *error = size == 0 ? "empty file" : tjGetErrorStr2(h);
    return 0;
  }
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
  out.width = sw;
  out.height = sh;
  out.channels = channels;
  uint8_t* dst = nullptr;
  if (cmyk) {
    cmyk_.resize(static_cast<size_t>(sw) * sh * 4);
    dst = cmyk_.data();
  } else {
    out.pixels.resize(static_cast<size_t>(sw) * sh * channels);
    dst = out.pixels.data();
  }
  // Warnings (e.g. a few extraneous bytes, as in some ImageNet files) still give an image, as
  // they do in PIL; only fatal errors make the file corrupt.
  if (tjDecompress2(h, data, static_cast<unsigned long>(size), dst, sw, 0, sh, format,
                    TJFLAG_FASTDCT) != 0 &&
      tjGetErrorCode(h) == TJERR_FATAL) {
    if (error) *error = tjGetErrorStr2(h);
    return 0;
  }
  if (cmyk) {
    // Adobe writes inverted CMYK: the ink is 255 - value, so RGB = value * K / 255.
    out.pixels.resize(static_cast<size_t>(sw) * sh * channels);
    for (size_t i = 0, n = static_cast<size_t>(sw) * sh; i < n; ++i) {
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
  return static_cast<double>(sw) / width;
}

std::vector<uint8_t> encode_jpeg(const Image& img, int quality) {
  if (img.channels != 1 && img.channels != 3)
    throw std::invalid_argument("encode_jpeg: channels must be 1 or 3");
  tjhandle h = tjInitCompress();
  if (h == nullptr) throw std::runtime_error("TurboJPEG: cannot create a compressor");
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(h, img.pixels.data(), img.width, 0, img.height,
                             img.channels == 1 ? TJPF_GRAY : TJPF_RGB, &buf, &size,
                             img.channels == 1 ? TJSAMP_GRAY : TJSAMP_420, quality, 0);
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
