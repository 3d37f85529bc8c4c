// The failure counter of the mpirun tests: a failed check prints one line naming the rank and
// the behaviour, and the test carries on so that every rank reports; main turns the count into
// the exit code.
#pragma once

#include <cstdio>
#include <string>

namespace gg::test {

inline int failures = 0;

inline void check(bool ok, const std::string& what, int rank) {
  if (!ok) {
    std::fprintf(stderr, "rank %d: FAIL: %s\n", rank, what.c_str());
    ++failures;
  }
}

}  // namespace gg::test
