// .npy/.npz reading and writing: exact round trips, files numpy writes (when /usr/bin/python3
// has numpy), numpy reading ours, and malformed files ending in one-line errors.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "kernels/npz.hpp"
#include "tests/kernels/scratch.hpp"

using namespace gg::kernels;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& test) { return gg::test::scratch("gg_npz", test); }
using gg::test::slurp;

void spit(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Arrays that exercise the format: a scalar, an empty array, odd shapes, special floats.
NpzEntries sample_arrays() {
  NpzEntries e;
  std::vector<float> w(2 * 3 * 5 * 7);
  for (size_t k = 0; k < w.size(); ++k) w[k] = std::sin(static_cast<float>(k)) * 1e3f;
  w[0] = -0.f;
  w[1] = std::numeric_limits<float>::quiet_NaN();
  w[2] = std::numeric_limits<float>::infinity();
  w[3] = std::numeric_limits<float>::denorm_min();
  w[4] = 1.5f;
  e.emplace_back("layer1.0.conv1.weight", NpyArray::floats({2, 3, 5, 7}, w));
  e.emplace_back("bn1.bias", NpyArray::floats({3}, {1.f, 2.f, 3.f}));
  e.emplace_back("bn1.num_batches_tracked", NpyArray::int64s({}, {int64_t{1} << 40}));
  e.emplace_back("empty", NpyArray::floats({0, 4}, {}));
  e.emplace_back("scalar", NpyArray::floats({}, {0.5f}));
  e.emplace_back("ints", NpyArray::int64s({2, 2}, {-1, 0, 1, std::numeric_limits<int64_t>::max()}));
  return e;
}

void check_equal(const NpzEntries& a, const NpzEntries& b) {
  REQUIRE(a.size() == b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    INFO(a[k].first);
    CHECK(a[k].first == b[k].first);
    CHECK(a[k].second.shape == b[k].second.shape);
    CHECK(a[k].second.is_float() == b[k].second.is_float());
    CHECK(same_bits(a[k].second.f, b[k].second.f));
    CHECK(a[k].second.i == b[k].second.i);
  }
}

// The message of the NpyError `f` throws ("" when it throws nothing).
template <typename F>
std::string npy_error(F f) {
  try {
    f();
  } catch (const NpyError& e) {
    return e.what();
  }
  return "";
}

bool have_numpy() { return std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0; }

int python(const fs::path& dir, const std::string& script) {
  spit(dir / "script.py", script);
  const std::string cmd = "cd '" + dir.string() + "' && /usr/bin/python3 script.py";
  return std::system(cmd.c_str());
}

}  // namespace

TEST_CASE("npz written and read back is bit-identical, stored and with ZIP64 records") {
  const fs::path dir = scratch("roundtrip");
  const NpzEntries arrays = sample_arrays();
  write_npz((dir / "a.npz").string(), arrays);
  check_equal(read_npz((dir / "a.npz").string()), arrays);
  write_npz((dir / "z64.npz").string(), arrays, /*force_zip64=*/true);
  check_equal(read_npz((dir / "z64.npz").string()), arrays);
  CHECK(read_npz((dir / "a.npz").string())[2].second.type == NpyType::Int64);
  // No temporary files are left behind.
  int files = 0;
  for ([[maybe_unused]] const auto& f : fs::directory_iterator(dir)) ++files;
  CHECK(files == 2);
  fs::remove_all(dir);
}

TEST_CASE("npy written and read back is bit-identical") {
  const fs::path dir = scratch("npy");
  for (const auto& [name, a] : sample_arrays()) {
    INFO(name);
    write_npy((dir / "x.npy").string(), a);
    const NpyArray b = read_npy((dir / "x.npy").string());
    CHECK(b.shape == a.shape);
    CHECK(same_bits(b.f, a.f));
    CHECK(b.i == a.i);
    // numpy's layout: the data start at a multiple of 64 bytes.
    const std::string bytes = slurp(dir / "x.npy");
    const size_t elem = a.is_float() ? 4 : 8;
    CHECK((bytes.size() - a.size() * elem) % 64 == 0);
  }
  fs::remove_all(dir);
}

TEST_CASE("an empty npz archive reads as no arrays") {
  const fs::path dir = scratch("empty");
  write_npz((dir / "e.npz").string(), {});
  CHECK(read_npz((dir / "e.npz").string()).empty());
  fs::remove_all(dir);
}

TEST_CASE("writing refuses duplicate names and arrays whose data do not fill their shape") {
  const fs::path dir = scratch("badwrite");
  NpzEntries dup = {{"a", NpyArray::floats({1}, {1.f})}, {"a", NpyArray::floats({1}, {2.f})}};
  CHECK_THROWS_AS(write_npz((dir / "d.npz").string(), dup), std::invalid_argument);
  NpzEntries short_data = {{"a", NpyArray::floats({2, 2}, {1.f})}};
  CHECK_THROWS_AS(write_npz((dir / "s.npz").string(), short_data), std::invalid_argument);
  for (const char* bad : {"\x9f", "a\xc3", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80"})
    CHECK_THROWS_AS(write_npz((dir / "u.npz").string(), {{bad, NpyArray::floats({1}, {1.f})}}),
                    std::invalid_argument);
  CHECK_FALSE(fs::exists(dir / "u.npz"));
  CHECK_FALSE(fs::exists(dir / "d.npz"));
  CHECK(npy_error([&] {
          write_npz((dir / "no/such/dir/x.npz").string(), {});
        }).find("no/such/dir/x.npz") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("malformed files give one-line errors naming the file and the problem") {
  const fs::path dir = scratch("malformed");
  const std::string good_path = (dir / "good.npz").string();
  write_npz(good_path, sample_arrays());
  const std::string good = slurp(good_path);
  const auto error_of = [&](const std::string& bytes, bool npz = true) {
    const fs::path p = dir / (npz ? "bad.npz" : "bad.npy");
    spit(p, bytes);
    return npy_error([&] {
      if (npz)
        read_npz(p.string());
      else
        read_npy(p.string());
    });
  };
  const auto has = [](const std::string& msg, const std::string& needle) {
    INFO(msg);
    CHECK(msg.find(needle) != std::string::npos);
    CHECK(msg.find('\n') == std::string::npos);
  };
  has(npy_error([&] { read_npz((dir / "missing.npz").string()); }), "missing.npz: no such file");
  has(npy_error([&] { read_npz(dir.string()); }), "is a folder");
  has(error_of("hello, world, this is not a zip file at all"), "not a zip archive");
  has(error_of(""), "not a zip archive");

  // A flipped data byte: the CRC catches it.
  std::string flipped = good;
  const size_t data_at = good.find("\x93NUMPY") + 128 + 10;
  flipped[data_at] ^= 0x01;
  has(error_of(flipped), "CRC-32 mismatch");

  // Truncation anywhere: an error, never a crash or a partial result.
  for (size_t n = 0; n < good.size(); n += 7) {
    INFO("truncated to " << n << " bytes");
    const std::string e = error_of(good.substr(0, n));
    CHECK(e.find("bad.npz") != std::string::npos);
  }
  // Any single corrupted byte: an NpyError or (in fields nobody reads) a correct result.
  for (size_t at = 0; at < good.size(); ++at) {
    std::string bytes = good;
    bytes[at] = static_cast<char>(bytes[at] ^ 0x5A);
    spit(dir / "bad.npz", bytes);
    try {
      read_npz((dir / "bad.npz").string());
    } catch (const NpyError& e) {
      INFO("byte " << at << ": " << e.what());
      CHECK(std::string(e.what()).find("bad.npz") != std::string::npos);
    }
  }

  // .npy headers.
  const auto npy = [](const std::string& dict, int major = 1) {
    std::string h = std::string("\x93NUMPY", 6) + static_cast<char>(major) + '\0';
    if (major == 1) {
      h += static_cast<char>(dict.size() & 0xFF);
      h += static_cast<char>(dict.size() >> 8);
    } else {
      h += static_cast<char>(dict.size() & 0xFF);
      h += static_cast<char>(dict.size() >> 8);
      h += std::string(2, '\0');
    }
    return h + dict;
  };
  const std::string f4 = std::string(8, '\0');  // two float32 zeros
  has(error_of(npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }") + f4, false),
      "fortran_order True is not supported");
  has(error_of(npy("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }") + f4, false),
      "dtype '>f4' is not supported");
  has(error_of(npy("{'descr': '<f4', 'shape': (2,), }") + f4, false), "lacks the key");
  has(error_of(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }") + f4, false),
      "truncated");
  has(error_of(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }") + f4, false),
      "needs 4 data bytes, but 8");
  has(error_of(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 4) + f4, false),
      "version 4.0 is not supported");
  has(error_of(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }") + f4, false),
      "shape");
  has(error_of(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, "
                   "99999999999, 99999999999), }") +
                   f4,
               false),
      "too large");
  has(error_of("PK\x03\x04 not an npy", false), "magic string");
  const std::string v2 = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 2) + f4;
  CHECK(error_of(v2, false).empty());

  // An npz member that is not an .npy array.
  NpzEntries one = {{"x", NpyArray::floats({1}, {1.f})}};
  write_npz((dir / "one.npz").string(), one);
  std::string renamed = slurp(dir / "one.npz");
  for (size_t at = renamed.find("x.npy"); at != std::string::npos; at = renamed.find("x.npy"))
    renamed.replace(at, 5, "x.txt");
  has(error_of(renamed), "member 'x.txt' is not a .npy array");

  // A member name that is not UTF-8 (a byte 0x9f alone, no UTF-8 flag): refused on reading, as
  // writing refuses it (libarchive could not read such a name back; found by fuzz_npz).
  std::string latin = slurp(dir / "one.npz");
  for (size_t at = latin.find("x.npy"); at != std::string::npos; at = latin.find("x.npy"))
    latin[at] = '\x9f';
  has(error_of(latin), "not UTF-8 text");
  fs::remove_all(dir);
}

TEST_CASE("files numpy writes are read: save, savez, savez_compressed, format 2.0 and 3.0") {
  if (!have_numpy()) {
    WARN("skipped: /usr/bin/python3 with numpy is not available");
    return;
  }
  const fs::path dir = scratch("numpy_in");
  REQUIRE(python(dir, R"PY(
import numpy as np
a = (np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4) - 7) / 3
np.save("f4.npy", a)
np.save("f8.npy", a.astype(np.float64) / 7)
np.save("i8.npy", np.int64(12345))
np.save("fortran.npy", np.asfortranarray(a))
big = np.random.default_rng(1).standard_normal((64, 1000)).astype(np.float32)
np.savez("stored.npz", **{"conv1.weight": a, "bn1.num_batches_tracked": np.array(7, dtype=np.int64)})
np.savez_compressed("deflated.npz", **{"fc.weight": big, "zeros": np.zeros((300, 300), np.float32)})
with open("v2.npy", "wb") as f:
    np.lib.format.write_array(f, a, version=(2, 0))
with open("v3.npy", "wb") as f:
    np.lib.format.write_array(f, a, version=(3, 0))
big.tofile("big.raw")
)PY") == 0);
  std::vector<float> a(24);
  for (int k = 0; k < 24; ++k) a[k] = (static_cast<float>(k) - 7.f) / 3.f;
  for (const char* name : {"f4.npy", "v2.npy", "v3.npy"}) {
    INFO(name);
    const NpyArray x = read_npy((dir / name).string());
    CHECK(x.shape == Dims{2, 3, 4});
    CHECK(x.type == NpyType::Float32);
    CHECK(same_bits(x.f, a));
  }
  const NpyArray f8 = read_npy((dir / "f8.npy").string());
  CHECK(f8.type == NpyType::Float64);
  for (int k = 0; k < 24; ++k)
    CHECK(f8.f[k] == static_cast<float>(static_cast<double>(a[k]) / 7.0));
  const NpyArray i8 = read_npy((dir / "i8.npy").string());
  CHECK(i8.shape.empty());
  CHECK(i8.i == std::vector<int64_t>{12345});
  CHECK(npy_error([&] { read_npy((dir / "fortran.npy").string()); }).find("fortran_order") !=
        std::string::npos);

  const NpzEntries stored = read_npz((dir / "stored.npz").string());
  REQUIRE(stored.size() == 2);
  CHECK(same_bits(find_array(stored, "conv1.weight")->f, a));
  CHECK(find_array(stored, "bn1.num_batches_tracked")->i == std::vector<int64_t>{7});

  const NpzEntries deflated = read_npz((dir / "deflated.npz").string());
  const std::string raw = slurp(dir / "big.raw");
  std::vector<float> big(raw.size() / 4);
  std::memcpy(big.data(), raw.data(), raw.size());
  REQUIRE(find_array(deflated, "fc.weight") != nullptr);
  CHECK(find_array(deflated, "fc.weight")->shape == Dims{64, 1000});
  CHECK(same_bits(find_array(deflated, "fc.weight")->f, big));
  CHECK(find_array(deflated, "zeros")->f == std::vector<float>(90000, 0.f));

  // A corrupt deflate stream is an error, not a crash.
  std::string bytes = slurp(dir / "deflated.npz");
  const size_t at = bytes.find("fc.weight.npy") + 13 + 20 + 100;
  for (size_t k = 0; k < 16; ++k) bytes[at + k] = static_cast<char>(0xFF);
  spit(dir / "corrupt.npz", bytes);
  const std::string e = npy_error([&] { read_npz((dir / "corrupt.npz").string()); });
  INFO(e);
  CHECK(e.find("corrupt.npz: member 'fc.weight.npy'") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("numpy reads the npz and npy files written here, also with ZIP64 records") {
  if (!have_numpy()) {
    WARN("skipped: /usr/bin/python3 with numpy is not available");
    return;
  }
  const fs::path dir = scratch("numpy_out");
  write_npz((dir / "plain.npz").string(), sample_arrays());
  write_npz((dir / "zip64.npz").string(), sample_arrays(), true);
  write_npy((dir / "y.npy").string(), NpyArray::floats({2, 3}, {1, 2, 3, 4, 5, 6}));
  CHECK(python(dir, R"PY(
import numpy as np, zipfile
for name in ["plain.npz", "zip64.npz"]:
    assert zipfile.ZipFile(name).testzip() is None, name
    z = np.load(name)
    assert list(z.keys()) == ["layer1.0.conv1.weight", "bn1.bias", "bn1.num_batches_tracked",
                              "empty", "scalar", "ints"], list(z.keys())
    w = z["layer1.0.conv1.weight"]
    assert w.dtype == np.float32 and w.shape == (2, 3, 5, 7), (w.dtype, w.shape)
    assert np.signbit(w.flat[0]) and np.isnan(w.flat[1]) and np.isinf(w.flat[2]), w.flat[:4]
    assert w.flat[3] == np.float32(1e-45) and w.flat[4] == 1.5, w.flat[:5]
    t = z["bn1.num_batches_tracked"]
    assert t.dtype == np.int64 and t.shape == () and int(t) == 1 << 40, t
    assert z["empty"].shape == (0, 4) and z["scalar"].shape == () and z["scalar"] == 0.5
    assert z["ints"].dtype == np.int64 and z["ints"][1, 1] == np.iinfo(np.int64).max
y = np.load("y.npy")
assert y.dtype == np.float32 and y.shape == (2, 3) and y.tolist() == [[1, 2, 3], [4, 5, 6]], y
)PY") == 0);
  fs::remove_all(dir);
}

TEST_CASE("array names outside ASCII round-trip and reach numpy as the same names") {
  const fs::path dir = scratch("utf8");
  const NpzEntries arrays = {{"gewicht.\xc3\xa9", NpyArray::floats({2}, {1.f, 2.f})},
                             {"plain", NpyArray::floats({}, {3.f})}};
  write_npz((dir / "u.npz").string(), arrays);
  check_equal(read_npz((dir / "u.npz").string()), arrays);
  if (!have_numpy()) {
    WARN("numpy part skipped: /usr/bin/python3 with numpy is not available");
    fs::remove_all(dir);
    return;
  }
  CHECK(python(dir, R"PY(
import numpy as np
z = np.load("u.npz")
assert list(z.keys()) == ["gewicht.\u00e9", "plain"], list(z.keys())
np.savez("from_numpy.npz", **{"\u00fcber": np.arange(3, dtype=np.float32)})
)PY") == 0);
  const NpzEntries back = read_npz((dir / "from_numpy.npz").string());
  REQUIRE(back.size() == 1);
  CHECK(back[0].first == std::string("\xc3\xbc") + "ber");
  fs::remove_all(dir);
}
