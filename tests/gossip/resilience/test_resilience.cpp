#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gossip/comm/low_rank.hpp"
#include "gossip/comm/rules.hpp"
#include "gossip/comm/wire.hpp"
#include "gossip/config/config.hpp"
#include "gossip/resilience/emergency.hpp"
#include "gossip/resilience/rank_state.hpp"
#include "gossip/resilience/supervise.hpp"
#include "gossip/train/recovery.hpp"

namespace fs = std::filesystem;
using namespace gg::gossip;

namespace {

RankState sample_state() {
  RankState s;
  s.step = 1234;
  s.steps_per_epoch = 100;
  s.rank = 1;
  s.ranks = 3;
  s.lr_scale = 0.25;
  s.nan_restores = 2;
  s.dropout_step = 77;
  s.sgd_started = true;
  s.params = {1.f, -2.5f, 3e-7f, 4.f};
  s.buffers = {0.5f, 0.25f};
  s.velocity = {0.1f, 0.2f, 0.3f, 0.4f};
  s.delayed_delta = {-1.f, 0.f, 1.f, 2.f};
  s.shuffle = {9, 8, 7};
  s.consensus_distance = 0.125;
  s.parts = {{"weights", "some-rule", 1, {1, 2, 3}},
             {"weights", "wire-residue", 2, {}},
             {"momentum", "some-rule", 7, {0, 255, 9, 9, 9}}};
  return s;
}

// Format 1's bytes (before the exchanges' state became parts) of sample_state's scalars and
// arrays, with a weight residue, public copies of the weights and the momentum, and the weights'
// low-rank factors: what a checkpoint of a gossipgrad of before 2026-11-29 holds.
std::vector<uint8_t> format1_bytes(const RankState& s) {
  std::vector<uint8_t> b;
  const auto raw = [&b](const void* p, size_t n) {
    b.insert(b.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  };
  const auto put = [&raw](auto v) { raw(&v, sizeof v); };
  const auto array = [&](const auto& v) {
    put(uint64_t{v.size()});
    raw(v.data(), v.size() * sizeof v[0]);
  };
  const auto copies = [&](const std::vector<PublicCopy>& v) {
    put(uint64_t{v.size()});
    for (const PublicCopy& c : v) {
      put(int64_t{c.peer});
      put(uint64_t{c.mine});
      array(c.values);
    }
  };
  raw("GGRANK01", 8);
  for (const int64_t v : {s.step, s.steps_per_epoch, int64_t{s.rank}, int64_t{s.ranks}}) put(v);
  put(s.lr_scale);
  put(int64_t{s.nan_restores});
  put(s.dropout_step);
  put(uint64_t{s.sgd_started});
  array(s.params);
  array(s.buffers);
  array(s.velocity);
  array(s.delayed_delta);
  array(s.shuffle);
  put(s.consensus_distance);
  array(std::vector<float>());                           // the gradients' residue: none
  array(std::vector<float>{1e-3f, -2e-3f, 0.f, 5e-4f});  // the weights'
  array(std::vector<float>());                           // the momentum's
  copies({{0, true, {1.f, 2.f, 3.f, 4.f}}, {0, false, {-1.f, 0.5f, 0.f, 8.f}}});
  copies({{2, false, {0.f, 0.f, 1e-3f, 0.f}}});
  copies({{0, true, {0.5f, -0.5f}}});
  copies({});
  put(checksum(b.data(), b.size()));
  return b;
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("gg-resil-" + std::to_string(::getpid()) + "-" +
                                        std::to_string(reinterpret_cast<uintptr_t>(this)));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// A complete checkpoint of `ranks` rank files in root/ckpt-<step>.
std::string make_checkpoint(const fs::path& root, int64_t step, int ranks) {
  const fs::path folder = root / checkpoint_folder_name(step);
  fs::create_directories(folder);
  Manifest m;
  m.step = step;
  m.ranks = ranks;
  m.steps_per_epoch = 10;
  m.model.name = "resnet8";
  m.model.input = {1, 28, 28};
  m.model.classes = 10;
  for (int r = 0; r < ranks; ++r) {
    RankState s = sample_state();
    s.rank = r;
    s.ranks = ranks;
    s.step = step;
    const auto bytes = encode_state(s);
    m.files[rank_file_name(r)] =
        write_file_durably((folder / rank_file_name(r)).string(), bytes.data(), bytes.size());
  }
  write_manifest(folder.string(), m);
  return folder.string();
}

}  // namespace

TEST_CASE("a rank state survives encode and decode bit for bit", "[resilience]") {
  const RankState s = sample_state();
  const auto bytes = encode_state(s);
  const RankState t = decode_state(bytes.data(), bytes.size(), "x");
  CHECK(t.step == s.step);
  CHECK(t.steps_per_epoch == s.steps_per_epoch);
  CHECK(t.rank == s.rank);
  CHECK(t.ranks == s.ranks);
  CHECK(t.lr_scale == s.lr_scale);
  CHECK(t.nan_restores == s.nan_restores);
  CHECK(t.dropout_step == s.dropout_step);
  CHECK(t.sgd_started == s.sgd_started);
  CHECK(t.params == s.params);
  CHECK(t.buffers == s.buffers);
  CHECK(t.velocity == s.velocity);
  CHECK(t.delayed_delta == s.delayed_delta);
  CHECK(t.shuffle == s.shuffle);
  CHECK(t.consensus_distance == s.consensus_distance);
  REQUIRE(t.parts.size() == s.parts.size());
  for (size_t i = 0; i < s.parts.size(); ++i) {
    CHECK(t.parts[i].exchange == s.parts[i].exchange);
    CHECK(t.parts[i].kind == s.parts[i].kind);
    CHECK(t.parts[i].version == s.parts[i].version);
    CHECK(t.parts[i].bytes == s.parts[i].bytes);
  }
  CHECK(encode_state(t) == bytes);
  RankState wrong = s;  // a part without a name
  wrong.parts[1].kind.clear();
  auto bad = encode_state(wrong);
  CHECK_THROWS_WITH(decode_state(bad.data(), bad.size(), "x"), Catch::Contains("x: corrupt"));
}

TEST_CASE("a rank state of format 1 is read into the parts its owners write today",
          "[resilience]") {
  const RankState s = sample_state();
  const std::vector<uint8_t> old = format1_bytes(s);
  const RankState t = decode_state(old.data(), old.size(), "old");
  CHECK(t.step == s.step);
  CHECK(t.params == s.params);
  CHECK(t.velocity == s.velocity);
  CHECK(t.shuffle == s.shuffle);
  CHECK(t.consensus_distance == s.consensus_distance);
  REQUIRE(t.parts.size() == 4);
  CHECK((t.parts[0].exchange == "weights" && t.parts[0].kind == kResidueKind));
  CHECK(read_residue(t.parts[0]) == std::vector<float>{1e-3f, -2e-3f, 0.f, 5e-4f});
  CHECK((t.parts[1].exchange == "weights" && t.parts[1].kind == kPublicCopiesKind));
  const std::vector<PublicCopy> copies = read_copies(t.parts[1]);
  REQUIRE(copies.size() == 2);
  CHECK((copies[1].peer == 0 && !copies[1].mine));
  CHECK(copies[1].values == std::vector<float>{-1.f, 0.5f, 0.f, 8.f});
  CHECK((t.parts[2].exchange == "momentum" && t.parts[2].kind == kPublicCopiesKind));
  CHECK(read_copies(t.parts[2])[0].peer == 2);
  CHECK((t.parts[3].exchange == "weights" && t.parts[3].kind == kLowRankKind));
  CHECK(read_copies(t.parts[3])[0].values == std::vector<float>{0.5f, -0.5f});
  // Written again, it is format 2, and reads back the same.
  const std::vector<uint8_t> now = encode_state(t);
  CHECK(std::string(now.begin(), now.begin() + 8) == "GGRANK02");
  CHECK(decode_state(now.data(), now.size(), "now").parts.size() == 4);
  // A format this gossipgrad does not know is named as such.
  std::vector<uint8_t> newer = now;
  newer[7] = '3';
  const uint64_t sum = checksum(newer.data(), newer.size() - 8);
  std::memcpy(newer.data() + newer.size() - 8, &sum, 8);
  CHECK_THROWS_WITH(decode_state(newer.data(), newer.size(), "x"), Catch::Contains("newer format"));
}

TEST_CASE("every truncation and every flipped byte of a rank state is rejected", "[resilience]") {
  const auto bytes = encode_state(sample_state());
  for (size_t n = 0; n < bytes.size(); ++n)
    REQUIRE_THROWS_AS(decode_state(bytes.data(), n, "x"), std::runtime_error);
  for (size_t i = 0; i < bytes.size(); ++i) {
    auto bad = bytes;
    bad[i] ^= 0x5a;
    REQUIRE_THROWS_AS(decode_state(bad.data(), bad.size(), "x"), std::runtime_error);
  }
  CHECK_THROWS_WITH(decode_state(bytes.data(), bytes.size() - 1, "rank-00001.bin"),
                    Catch::Contains("rank-00001.bin"));
}

TEST_CASE("a written checkpoint verifies; a changed, truncated or missing file does not",
          "[resilience]") {
  TempDir tmp;
  const std::string folder = make_checkpoint(tmp.path, 40, 2);
  CHECK(verify_checkpoint(folder).empty());
  const Manifest m = read_manifest(folder);
  CHECK(m.step == 40);
  CHECK(m.ranks == 2);
  CHECK(m.files.size() == 2);
  CHECK(m.unreported_bytes == 0);  // none written: none read
  const fs::path f = fs::path(folder) / rank_file_name(1);
  SECTION("rank 0's unreported bytes travel in the manifest; a negative count is refused") {
    Manifest w = m;
    w.unreported_bytes = 20568;
    write_manifest(folder, w);
    CHECK(read_manifest(folder).unreported_bytes == 20568);
    w.unreported_bytes = -1;
    write_manifest(folder, w);
    CHECK_THROWS_WITH(read_manifest(folder), Catch::Contains("unreported_bytes out of range"));
  }
  SECTION("one byte changed") {
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(20);
    io.put('\x7f');
    io.close();
    CHECK_THAT(verify_checkpoint(folder), Catch::Contains("checksum mismatch"));
  }
  SECTION("truncated") {
    fs::resize_file(f, fs::file_size(f) - 3);
    CHECK_THAT(verify_checkpoint(folder), Catch::Contains("bytes, the manifest says"));
  }
  SECTION("missing") {
    fs::remove(f);
    CHECK_THAT(verify_checkpoint(folder), Catch::Contains("is missing"));
  }
  SECTION("no manifest: an incomplete checkpoint") {
    fs::remove(fs::path(folder) / kManifest);
    CHECK_THAT(verify_checkpoint(folder), Catch::Contains("incomplete"));
  }
  SECTION("a malformed manifest") {
    std::ofstream(fs::path(folder) / kManifest) << "{\"format\": \"gossipgrad-full-checkpoint\"";
    CHECK_FALSE(verify_checkpoint(folder).empty());
  }
}

TEST_CASE("resume takes the newest valid checkpoint and names each one it skips", "[resilience]") {
  TempDir tmp;
  make_checkpoint(tmp.path, 10, 2);
  const std::string mid = make_checkpoint(tmp.path, 20, 2);
  const std::string newest = make_checkpoint(tmp.path, 30, 2);
  fs::create_directories(tmp.path / checkpoint_folder_name(40));  // a write that never finished
  fs::resize_file(fs::path(newest) / rank_file_name(0), 5);
  std::vector<std::string> rejected;
  const auto found = find_latest_valid(tmp.path.string(), rejected);
  REQUIRE(found);
  CHECK(*found == mid);
  REQUIRE(rejected.size() == 2);
  CHECK_THAT(rejected[0], Catch::Contains("ckpt-000000000040"));
  CHECK_THAT(rejected[1], Catch::Contains("ckpt-000000000030"));
  // A folder named directly is taken or refused on its own.
  rejected.clear();
  CHECK_FALSE(find_latest_valid(newest, rejected));
  CHECK(rejected.size() == 1);
  rejected.clear();
  CHECK(find_latest_valid(mid, rejected) == mid);
  // An empty folder: nothing, nothing rejected.
  TempDir empty;
  rejected.clear();
  CHECK_FALSE(find_latest_valid(empty.path.string(), rejected));
  CHECK(rejected.empty());
}

TEST_CASE("pruning keeps the newest complete checkpoints and a write in progress", "[resilience]") {
  TempDir tmp;
  for (int64_t step : {10, 20, 30, 40}) make_checkpoint(tmp.path, step, 1);
  fs::create_directories(tmp.path / checkpoint_folder_name(5));   // stale partial
  fs::create_directories(tmp.path / checkpoint_folder_name(50));  // being written
  prune_checkpoints(tmp.path.string(), 2);
  std::vector<int64_t> left;
  for (const auto& [step, folder] : list_checkpoints(tmp.path.string())) left.push_back(step);
  CHECK(left == std::vector<int64_t>{50, 40, 30});
}

TEST_CASE("write_file_durably replaces a file whole and leaves no temporary behind",
          "[resilience]") {
  TempDir tmp;
  const std::string path = (tmp.path / "f.bin").string();
  const std::string a = "first", b = "second, longer";
  write_file_durably(path, a.data(), a.size());
  const FileDigest d = write_file_durably(path, b.data(), b.size());
  CHECK(d.size == b.size());
  CHECK(d.hash == checksum(b.data(), b.size()));
  std::ifstream f(path);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  CHECK(text == b);
  CHECK(std::distance(fs::directory_iterator(tmp.path), fs::directory_iterator()) == 1);
  CHECK_THROWS_AS(write_file_durably((tmp.path / "no" / "f").string(), a.data(), a.size()),
                  std::runtime_error);
}

TEST_CASE("supervise restarts add resume auto and shrink mpirun's rank count", "[resilience]") {
  const std::vector<std::string> job = {"mpirun", "-n", "4", "gossipgrad", "train", "--x", "1"};
  auto r = restart_command(job, 1, false, 1);
  CHECK(r == std::vector<std::string>{"mpirun", "-n", "4", "gossipgrad", "train", "--x", "1",
                                      "--checkpoint.resume", "auto"});
  r = restart_command(job, 2, true, 1);
  CHECK(r[2] == "2");
  r = restart_command(job, 5, true, 3);
  CHECK(r[2] == "3");
  const std::vector<std::string> named = {"mpirun", "-np", "2", "g", "--checkpoint.resume=DIR"};
  r = restart_command(named, 1, true, 1);
  CHECK(r == std::vector<std::string>{"mpirun", "-np", "1", "g", "--checkpoint.resume=DIR"});
  // A restart resumes where the supervisor says (the newest checkpoint the job wrote), not from
  // the folder the job was launched with.
  r = restart_command(named, 1, false, 1, "CK/ckpt-000000000140");
  CHECK(r == std::vector<std::string>{"mpirun", "-np", "2", "g", "--checkpoint.resume",
                                      "CK/ckpt-000000000140"});
  const std::vector<std::string> spaced = {
      "mpirun", "-n", "2", "gossipgrad", "train", "--checkpoint.resume", "CK/ckpt-20", "--x", "1"};
  r = restart_command(spaced, 1, false, 1, "auto");
  CHECK(r == std::vector<std::string>{"mpirun", "-n", "2", "gossipgrad", "train", "--x", "1",
                                      "--checkpoint.resume", "auto"});
  r = restart_command(spaced, 1, false, 1, "");  // afresh: no resume at all
  CHECK(r == std::vector<std::string>{"mpirun", "-n", "2", "gossipgrad", "train", "--x", "1"});
}

TEST_CASE("supervise turns hydra's failure notice on and sets the survivors' rank count",
          "[resilience]") {
  const std::vector<std::string> job = {"mpiexec.hydra", "-n", "4", "gossipgrad", "train"};
  CHECK(is_hydra_launcher("mpiexec.hydra"));
  CHECK_FALSE(is_hydra_launcher("gossipgrad"));
  CHECK_FALSE(is_hydra_launcher("/nonexistent/srun"));
  const auto on = with_failure_notice(job);
  CHECK(on == std::vector<std::string>{"mpiexec.hydra", "-disable-auto-cleanup", "-n", "4",
                                       "gossipgrad", "train"});
  CHECK(with_failure_notice(on) == on);  // never twice
  CHECK(with_failure_notice({"gossipgrad", "train"}) ==
        std::vector<std::string>{"gossipgrad", "train"});
  CHECK(job_ranks(job) == 4);
  CHECK(with_ranks(job, 3)[2] == "3");
}

TEST_CASE("emergency states: survivors, lost ranks, a corrupt file and the recovery plan",
          "[resilience]") {
  TempDir tmp;
  const auto put = [&](int rank, int64_t step) {
    RankState s = sample_state();
    s.rank = rank;
    s.ranks = 4;
    s.step = step;
    const std::vector<uint8_t> bytes = encode_state(s);
    write_file_durably((tmp.path / rank_file_name(rank)).string(), bytes.data(), bytes.size());
  };
  put(0, 120);
  put(2, 121);
  put(3, 121);
  EmergencyScan scan = scan_emergency_states(tmp.path.string(), 4);
  CHECK(scan.survivors == std::vector<int>{0, 2, 3});
  CHECK(scan.lost == std::vector<int>{1});
  CHECK(scan.corrupt.empty());
  CHECK(scan.min_step == 120);
  CHECK(scan.max_step == 121);
  CHECK(scan.first_written_unix > 0);

  RecoveryPlan plan;
  plan.survivors = scan.survivors;
  plan.lost = scan.lost;
  plan.ranks_before = 4;
  plan.step = 120;
  plan.steps_redone = 1;
  plan.failed_unix = scan.first_written_unix;
  write_recovery_plan(tmp.path.string(), plan);
  const RecoveryPlan back = read_recovery_plan(tmp.path.string());
  CHECK(back.survivors == plan.survivors);
  CHECK(back.lost == plan.lost);
  CHECK(back.step == 120);
  CHECK(back.steps_redone == 1);

  // One flipped byte: named, and not a survivor.
  const fs::path f = tmp.path / rank_file_name(2);
  std::vector<uint8_t> bytes = read_file(f.string());
  bytes[bytes.size() / 2] ^= 0x10;
  std::ofstream(f, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  scan = scan_emergency_states(tmp.path.string(), 4);
  CHECK_THAT(scan.corrupt, Catch::Contains("rank-00002.bin") && Catch::Contains("checksum"));
  CHECK(scan.survivors == std::vector<int>{0, 3});
  // A state of another rank count does not pass for this one.
  CHECK_FALSE(scan_emergency_states(tmp.path.string(), 5).corrupt.empty());
  CHECK_THROWS_WITH(read_recovery_plan((tmp.path / "none").string()), Catch::Contains("missing"));
}

TEST_CASE("emergency states: after timeouts only, a rank the notice did not reach is lost",
          "[resilience]") {
  TempDir tmp;
  const auto put = [&](int rank, const char* when) {
    RankState s = sample_state();
    s.rank = rank;
    s.ranks = 3;
    s.step = 60;
    const std::vector<uint8_t> bytes = encode_state(s);
    write_file_durably((tmp.path / rank_file_name(rank)).string(), bytes.data(), bytes.size());
    std::ofstream(tmp.path / emergency_when_name(rank)) << when << "\n";
  };
  const auto reached = [&](int rank) {
    std::ofstream(tmp.path / emergency_reached_name(rank)).put('\n');
  };
  // Every rank timed out; the notice reached ranks 0 and 1 afterwards, not rank 2.
  put(0, "100.0 t");
  put(1, "100.5 t");
  put(2, "101.0 t");
  reached(0);
  reached(1);
  EmergencyScan scan = scan_emergency_states(tmp.path.string(), 3);
  CHECK(scan.survivors == std::vector<int>{0, 1});
  CHECK(scan.lost == std::vector<int>{2});
  CHECK(scan.unreachable == std::vector<int>{2});
  // Rank 2's saver saw its end only when the supervisor ended the job: no different.
  put(2, "105.0 g");
  CHECK(scan_emergency_states(tmp.path.string(), 3, 104.0).unreachable == std::vector<int>{2});
  // A rank that died (its saver saw it go before the supervisor acted): not a cut link, so every
  // state counts (restore).
  put(2, "101.0 g");
  scan = scan_emergency_states(tmp.path.string(), 3, 104.0);
  CHECK(scan.unreachable.empty());
  CHECK(scan.survivors == std::vector<int>{0, 1, 2});
  // Timeouts only, and the notice reached nobody: no rank is singled out.
  fs::remove(tmp.path / emergency_reached_name(0));
  fs::remove(tmp.path / emergency_reached_name(1));
  put(2, "101.0 t");
  CHECK(scan_emergency_states(tmp.path.string(), 3).survivors == std::vector<int>{0, 1, 2});
}

TEST_CASE("resilience options are range-checked with one clear line", "[resilience]") {
  const auto bad = [](std::vector<std::string> args, const std::string& what) {
    args.insert(args.begin(), {"--data.source", "synthetic:1x8x8", "--log.metrics",
                               "/nonexistent-dir-for-test/m.jsonl"});
    CHECK_THROWS_WITH(parse_train_args(args), Catch::Contains(what));
  };
  bad({"--checkpoint.every", "10"}, "checkpoint.every = 10 needs checkpoint.dir");
  bad({"--checkpoint.keep", "0"}, "checkpoint.keep = 0 is out of range");
  bad({"--checkpoint.resume", "auto"}, "checkpoint.resume = auto needs checkpoint.dir");
  bad({"--fault.kill", "1-2"}, "fault.kill = 1-2 must be RANK:STEP");
  bad({"--fault.stall", "a:3"}, "fault.stall = a:3 must be RANK:STEP");
  bad({"--guard.lr_factor", "0"}, "guard.lr_factor = 0 is out of range");
  bad({"--gossip.timeout_s", "-1"}, "gossip.timeout_s = -1 is out of range");
  bad({"--train.stop_at", "5"}, "train.stop_at = 5 needs checkpoint.dir");
  bad({"--train.stop_at", "20", "--train.max_steps", "20", "--checkpoint.dir", "/tmp/gg-never"},
      "train.stop_at = 20 is not before train.max_steps = 20: it would never stop the run");
  CHECK(parse_fault_kill("3:120") == std::pair<int, int64_t>{3, 120});
}
