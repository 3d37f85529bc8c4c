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

// One TurboJPEG decompressor; not thread-safe (one per worker thread).
class JpegDecoder {
 public:
  JpegDecoder();
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  // Reads the header only. Returns false (with *error set) when the data is not a JPEG.
  bool header(const uint8_t* data, size_t size, int& width, int& height, std::string* error);

  // Decodes to `channels` = 3 (RGB; grey and CMYK converted) or 1 (grey). With DCT scaling
  // TurboJPEG decodes at the smallest of its M/8 scales at which the image still has at least
  // min_width x min_height pixels, so a 2000-pixel photo bound for a 224 crop is decoded at 1/4 or
  // 1/8 of the work. Returns the scale used (decoded width / original width) or 0 with *error set
  // when the data is corrupt.
  double decode(const uint8_t* data, size_t size, int channels, int min_width, int min_height,
                Image& out, std::string* error);

 private:
  void* handle_;
  std::vector<uint8_t> cmyk_;
};

// Writes a baseline JPEG (4:2:0 for colour) of an image: for tests, pack examples and benchmarks.
std::vector<uint8_t> encode_jpeg(const Image& img, int quality = 90);

// Per-channel normalisation of pixel/255 (ImageNet's statistics by default).
struct PixelMap {
  float mean[3] = {0.485f, 0.456f, 0.406f};
  float std[3] = {0.229f, 0.224f, 0.225f};
};

// Resamples `box` of `img` (bilinear, pixel-centre aligned as PIL/torchvision) to an
// out_h x out_w float CHW tensor with img.channels channels, normalised per channel, mirrored
// when `flip`. No antialiasing filter: DCT scaling keeps the shrink factor below 2.
void resample_to_chw(const Image& img, const CropBox& box, int out_h, int out_w, bool flip,
                     const PixelMap& map, float* out);

}  // namespace gg::shuffle
