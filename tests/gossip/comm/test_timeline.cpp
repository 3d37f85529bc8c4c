#include <catch2/catch.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>

#include "gossip/comm/timeline.hpp"

using gg::gossip::Timeline;

namespace {
nlohmann::json parse_events(const Timeline& t, int pid) {
  std::string text = "[";
  text += t.events_json(pid);
  text += ']';
  return nlohmann::json::parse(text);
}
}  // namespace

TEST_CASE("timeline spans nest on their thread and come out as Chrome trace events") {
  Timeline t(true);
  t.name_thread("compute");
  {
    Timeline::Span step(&t, "step 0", "compute");
    { Timeline::Span f(&t, "forward", "compute"); }
    std::thread comm([&] {
      t.name_thread("comm 0");
      Timeline::Span b(&t, "bucket 3", "comm");
    });
    comm.join();
    { Timeline::Span b(&t, "backward", "compute"); }
  }
  const auto j = parse_events(t, 5);
  std::map<std::string, nlohmann::json> x;
  std::set<std::string> thread_names;
  for (const auto& e : j) {
    CHECK(e["pid"] == 5);
    if (e["ph"] == "M" && e["name"] == "thread_name") thread_names.insert(e["args"]["name"]);
    if (e["ph"] == "X") x[e["name"]] = e;
  }
  CHECK(thread_names == std::set<std::string>{"compute", "comm 0"});
  REQUIRE(x.size() == 4);
  const auto inside = [&](const std::string& in, const std::string& out) {
    const auto& a = x[in];
    const auto& b = x[out];
    return a["tid"] == b["tid"] && a["ts"] >= b["ts"] &&
           a["ts"].get<int64_t>() + a["dur"].get<int64_t>() <=
               b["ts"].get<int64_t>() + b["dur"].get<int64_t>();
  };
  CHECK(inside("forward", "step 0"));
  CHECK(inside("backward", "step 0"));
  CHECK(x["bucket 3"]["tid"] != x["step 0"]["tid"]);
  CHECK(x["forward"]["ts"].get<int64_t>() + x["forward"]["dur"].get<int64_t>() <=
        x["backward"]["ts"].get<int64_t>());
}

TEST_CASE("a disabled timeline records nothing") {
  Timeline t(false);
  { Timeline::Span s(&t, "step", "compute"); }
  { Timeline::Span s(nullptr, "step", "compute"); }
  CHECK(parse_events(t, 0).size() == 1);  // the process name
}
