#include <catch2/catch.hpp>
#include <set>

#include "partners/schedule.hpp"

using namespace gg::partners;

TEST_CASE("dissemination: send and receive partners are inverse permutations") {
  for (int p : {1, 2, 3, 5, 8, 13}) {
    for (int64_t t = 0; t < 10; ++t) {
      for (int v = 0; v < p; ++v) {
        const Partners me = dissemination(v, p, t);
        CHECK(dissemination(me.send_to, p, t).recv_from == v);
      }
    }
  }
}

TEST_CASE("dissemination reaches every rank in ceil(log2 p) steps") {
  for (int p : {2, 3, 4, 7, 16, 33}) {
    // reach[v] = ranks whose update has arrived at v
    std::vector<std::set<int>> reach(p);
    for (int v = 0; v < p; ++v) reach[v] = {v};
    for (int t = 0; t < rounds_per_cycle(p); ++t) {
      auto next = reach;
      for (int v = 0; v < p; ++v) {
        const int from = dissemination(v, p, t).recv_from;
        next[v].insert(reach[from].begin(), reach[from].end());
      }
      reach = next;
    }
    for (int v = 0; v < p; ++v) CHECK(static_cast<int>(reach[v].size()) == p);
  }
  CHECK(rounds_per_cycle(1) == 0);
  CHECK(rounds_per_cycle(5) == 3);
  CHECK_THROWS(dissemination(3, 3, 0));
}
