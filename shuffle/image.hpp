// JPEG decode/encode (TurboJPEG) and the image transforms of the data path: RandomResizedCrop +
// flip for training, resize of the shorter side + center crop for evaluation, both written
// straight into a normalised float CHW tensor.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace gg::shuffle {

// 8-bit interleaved pixels, rows of width * channels bytes (channels 1 or 3).
struct Image {
  int width = 0, height = 0, channels = 0;
  std::vector<uint8_t> pixels;
};

// A region of an image in its own pixel coordinates.
struct CropBox {
  double x = 0, y = 0, w = 0, h = 0;
};

// torchvision's RandomResizedCrop.get_params: up to 10 draws of an area fraction in
// [scale_min, scale_max] and a log-uniform aspect ratio in [ratio_min, ratio_max]; the first box
// that fits is placed uniformly at random. Otherwise the whole image, cropped to the nearest
// allowed ratio and centred. Box sides are whole pixels, as in torchvision.
struct RandomResizedCrop {
  double scale_min = 0.08, scale_max = 1.0;
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;
  CropBox sample(int width, int height, std::mt19937_64& rng) const;
};

// Evaluation: the shorter side resized to `resize`, then the centre `crop` x `crop` square; as a
// box in the original image's coordinates.
CropBox center_crop_box(int width, int height, int resize, int crop);

// Per-channel normalisation of pixel/255 (ImageNet's statistics by default).
struct PixelMap {
  float mean[3] = {0.485f, 0.456f, 0.406f};
  float std[3] = {0.229f, 0.224f, 0.225f};
};

// Limits on what one JPEG may cost to decode, checked on its header before any pixel is decoded
// (a 2 KB file can declare 65535 x 65535). Sequential JPEGs decode a few rows at a time at the DCT
// scale, so their cost follows the declared pixel count: 100 megapixels is far above any
// ImageNet photo. Progressive and multi-scan JPEGs make libjpeg hold the DCT coefficients
// of the whole image (2 bytes per sample, at any scale), so they are also bounded by that buffer:
// 256 MiB is a 4:2:0 colour photo of about 89 megapixels, a 4:4:4 one of about 44.
inline constexpr int64_t kMaxJpegPixels = 100'000'000;
inline constexpr int64_t kMaxJpegCoefficientBytes = int64_t{256} << 20;

// A JPEG's frame as its markers declare it, read up to the first scan without decoding.
struct JpegFrame {
  int width = 0, height = 0, components = 0;
  bool buffered = false;          // progressive or multi-scan: every coefficient is held
  int64_t coefficient_bytes = 0;  // the size of that whole-image buffer
  bool complete = false;          // an EOI marker follows the image data: the file is not cut
};

// Parses the markers up to the first scan (SOF and SOS). Returns false with *error set for data
// that is not a JPEG, ends before its first scan, or declares an empty frame.
bool read_jpeg_frame(const uint8_t* data, size_t size, JpegFrame& frame, std::string* error);

// One TurboJPEG decompressor; not thread-safe (one per worker thread). After any failure it starts
// over with a fresh TurboJPEG handle: libjpeg-turbo 2.1 leaves a handle whose header read failed
// mid-way in that state, and the next file would then be parsed from there.
class JpegDecoder {
 public:
  JpegDecoder();
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  // Reads the header only. Returns false (with *error set) when the data is not a JPEG, declares an
  // empty image, is truncated (no EOI marker after the image data: libjpeg would fill the missing
  // rows with grey, and PIL refuses such files), or is larger than kMaxJpegPixels /
  // kMaxJpegCoefficientBytes allow.
  bool header(const uint8_t* data, size_t size, int& width, int& height, std::string* error);

  // Decodes to `channels` = 3 (RGB; grey and CMYK converted) or 1 (grey). With DCT scaling
  // TurboJPEG decodes at the smallest of its M/8 scales at which the image still has at least
  // min_width x min_height pixels, so a 2000-pixel photo bound for a 224 crop is decoded at 1/4 or
  // 1/8 of the work. Returns the scale used (decoded width / original width) or 0 with *error set
  // when header() refuses the data or it is corrupt or truncated; `out` is then empty (0 x 0, no
  // pixels).
  // Other channel counts throw std::invalid_argument.
  double decode(const uint8_t* data, size_t size, int channels, int min_width, int min_height,
                Image& out, std::string* error);

 private:
  bool read_header(const uint8_t* data, size_t size, int& width, int& height, int& colorspace,
                   std::string* error);
  bool fail(const std::string& why, std::string* error);  // records why, then a fresh handle
  void* handle_;
  std::vector<uint8_t> cmyk_;
};

// Encoded (JPEG) samples: with augmentation, RandomResizedCrop to crop x crop + random horizontal
// flip; otherwise the shorter side resized to `resize` and the centre crop x crop. Then
// per-channel normalisation.
struct JpegOptions {
  int channels = 3;  // 3 (RGB) or 1 (grey)
  int crop = 224;
  int resize = 256;
  RandomResizedCrop rrc;
  PixelMap map;
};

// The loader's path for one encoded sample (the fuzz target runs it too): the header, the crop box
// (augment: j.rrc drawn from rng, else the centre crop), a flip drawn from rng when may_flip, a
// DCT-scaled decode just large enough for the box into `scratch`, and the resample to
// j.channels x j.crop x j.crop floats at out. Returns false with *error set when the file is
// unusable (corrupt, or above the limits); nothing is written to out then.
bool decode_to_chw(JpegDecoder& decoder, const uint8_t* data, size_t size, const JpegOptions& j,
                   bool augment, bool may_flip, std::mt19937_64& rng, Image& scratch, float* out,
                   std::string* error);

// Writes a JPEG (4:2:0 for colour; baseline, or progressive) of an image: for tests, pack examples,
// fuzz seeds and benchmarks.
std::vector<uint8_t> encode_jpeg(const Image& img, int quality = 90, bool progressive = false);

// Resamples `box` of `img` (bilinear, pixel-centre aligned as PIL/torchvision) to an
// out_h x out_w float CHW tensor with img.channels channels, normalised per channel, mirrored
// when `flip`. No antialiasing filter: DCT scaling keeps the shrink factor below 2. Throws
// std::invalid_argument for an image whose size and pixels disagree, channels outside 1..3, an
// empty output or a box that is not finite and positive.
void resample_to_chw(const Image& img, const CropBox& box, int out_h, int out_w, bool flip,
                     const PixelMap& map, float* out);

}  // namespace gg::shuffle
