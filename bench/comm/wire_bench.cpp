// The wire codecs' cost on one core: encode (with error feedback) and decode of a flat buffer of
// N values in buckets of B KiB, for each wire, the median of R runs; int8 and int4 also with
// stochastic rounding (the -sr rows: a new key each run, as each exchange has). What a lossy wire
// adds to a rank's communication thread per exchange, beside the bytes it saves.
// usage: gg_bench_wire [--values N (default 25557032, ResNet-50's)] [--bucket-kb B (4096)]
//                      [--runs R (5)]
// Output: CSV wire,values,bytes_on_wire,encode_ms,decode_ms (median of the runs).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "gossip/comm/wire.hpp"

using namespace gg::gossip;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
int64_t parse(const char* flag, const char* value) {
  char* end = nullptr;
  const long long v = std::strtoll(value, &end, 10);
  if (!end || *end || v < 1) {
    std::fprintf(stderr, "gg_bench_wire: %s %s: expected a positive integer\n", flag, value);
    std::exit(2);
  }
  return v;
}
}  // namespace

int main(int argc, char** argv) {
  int64_t values = 25557032, bucket_kb = 4096, runs = 5;
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (i + 1 >= argc || (a != "--values" && a != "--bucket-kb" && a != "--runs")) {
      std::fprintf(stderr,
                   "gg_bench_wire: unknown or incomplete argument '%s' (see the source's "
                   "usage line: --values N --bucket-kb B --runs R)\n",
                   a.c_str());
      return 2;
    }
    (a == "--values"      ? values
     : a == "--bucket-kb" ? bucket_kb
                          : runs) = parse(argv[i], argv[i + 1]);
  }
  // Buckets of bucket_kb KiB, bucket 0 last in the buffer (the trainer's layout).
  const int64_t per = bucket_kb * 1024 / 4;
  std::vector<gg::kernels::Bucket> buckets;
  for (int64_t end = values; end > 0; end -= per)
    buckets.push_back({std::max<int64_t>(0, end - per), end});
  std::vector<float> x(static_cast<size_t>(values));
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.05f * std::sin(0.001f * static_cast<float>(i));
  std::printf("wire,values,bytes_on_wire,encode_ms,decode_ms\n");
  for (const auto& [w, stochastic] : {std::pair{Wire::Bf16, false},
                                      {Wire::Int8, false},
                                      {Wire::Int4, false},
                                      {Wire::Int8, true},
                                      {Wire::Int4, true}}) {
    WireCodec codec(w, true, buckets, stochastic);
    std::vector<double> enc, dec;
    std::vector<const float*> images(buckets.size());
    for (int64_t r = 0; r < runs; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      for (size_t b = 0; b < buckets.size(); ++b)
        images[b] =
            codec.encode(static_cast<int>(b), x.data() + buckets[b].begin, wire_key(1, 0, r));
      auto t1 = std::chrono::steady_clock::now();
      float sink = 0;
      for (size_t b = 0; b < buckets.size(); ++b)
        sink += codec.decode(static_cast<int>(b), images[b])[0];
      auto t2 = std::chrono::steady_clock::now();
      if (std::isnan(sink)) std::printf("#\n");
      enc.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      dec.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
    }
    const char* name = w == Wire::Bf16 ? "bf16" : w == Wire::Int8 ? "int8" : "int4";
    std::printf("%s%s,%lld,%lld,%.2f,%.2f\n", name, stochastic ? "-sr" : "",
                static_cast<long long>(values), static_cast<long long>(codec.floats() * 4),
                median(enc), median(dec));
  }
}
