// Writes the seed inputs of fuzz_jpeg and fuzz_idx: JPEGs the way cameras and encoders write
// them (baseline colour and grey, progressive, CMYK) and small idx image/label pairs (plain,
// gzip, idx4, int32 labels) in fuzz_idx's input format. Usage: make_seeds JPEG_DIR IDX_DIR
#include <turbojpeg.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "shuffle/image.hpp"

namespace {

void save(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

gg::shuffle::Image pattern(int width, int height, int channels) {
  gg::shuffle::Image img;
  img.width = width;
  img.height = height;
  img.channels = channels;
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < channels; ++c)
        img.pixels.push_back(static_cast<uint8_t>((x * 37 + y * 11 + c * 80) & 0xff));
  return img;
}

std::vector<uint8_t> cmyk_jpeg(int width, int height) {
  std::vector<uint8_t> px;
  for (int i = 0; i < width * height; ++i)
    for (int c = 0; c < 4; ++c) px.push_back(static_cast<uint8_t>(i * 13 + c * 60));
  tjhandle h = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  std::vector<uint8_t> out;
  if (tjCompress2(h, px.data(), width, 0, height, TJPF_CMYK, &buf, &size, TJSAMP_444, 80, 0) == 0)
    out.assign(buf, buf + size);
  tjFree(buf);
  tjDestroy(h);
  return out;
}

void be32(std::vector<uint8_t>& v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(static_cast<uint8_t>(x >> s));
}

std::vector<uint8_t> gzip(const std::vector<uint8_t>& in) {
  std::vector<uint8_t> out(compressBound(static_cast<uLong>(in.size())) + 32);
  z_stream z{};
  deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);  // +16: a gzip wrapper
  z.next_in = const_cast<Bytef*>(in.data());
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// fuzz_idx's input: a 2-byte length, the images file, the labels file.
std::vector<uint8_t> idx_pair(const std::vector<uint8_t>& images,
                              const std::vector<uint8_t>& labels) {
  std::vector<uint8_t> v = {static_cast<uint8_t>(images.size() >> 8),
                            static_cast<uint8_t>(images.size())};
  v.insert(v.end(), images.begin(), images.end());
  v.insert(v.end(), labels.begin(), labels.end());
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: make_seeds JPEG_DIR IDX_DIR\n");
    return 2;
  }
  const std::string jpeg = argv[1], idx = argv[2];
  save(jpeg + "/rgb.jpg", gg::shuffle::encode_jpeg(pattern(24, 16, 3), 85));
  save(jpeg + "/grey.jpg", gg::shuffle::encode_jpeg(pattern(16, 16, 1), 85));
  save(jpeg + "/progressive.jpg", gg::shuffle::encode_jpeg(pattern(20, 12, 3), 85, true));
  save(jpeg + "/cmyk.jpg", cmyk_jpeg(8, 8));

  // Three 2x3 images, labels 2, 0, 1.
  std::vector<uint8_t> images = {0, 0, 0x08, 3}, images4 = {0, 0, 0x08, 4};
  for (uint32_t d : {3u, 2u, 3u}) be32(images, d);
  for (uint32_t d : {3u, 1u, 2u, 3u}) be32(images4, d);
  for (int i = 0; i < 18; ++i) {
    images.push_back(static_cast<uint8_t>(i * 14));
    images4.push_back(static_cast<uint8_t>(i * 14));
  }
  std::vector<uint8_t> labels = {0, 0, 0x08, 1}, labels32 = {0, 0, 0x0C, 1};
  be32(labels, 3);
  be32(labels32, 3);
  for (uint32_t v : {2u, 0u, 1u}) {
    labels.push_back(static_cast<uint8_t>(v));
    be32(labels32, v);
  }
  save(idx + "/plain", idx_pair(images, labels));
  save(idx + "/gzip", idx_pair(gzip(images), gzip(labels)));
  save(idx + "/idx4-int32", idx_pair(images4, labels32));
  return 0;
}
