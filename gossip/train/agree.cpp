#include "gossip/train/agree.hpp"

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

namespace gg::gossip {
namespace {

// FNV-1a: the same value for the same text in every binary (std::hash promises no such thing).
uint64_t fingerprint(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// "[section]" + "name = value" -> "section.name = value"; other lines as they are.
std::string setting_at(const std::vector<std::string>& lines, size_t at) {
  if (at >= lines.size()) return "(no setting)";
  std::string section;
  for (size_t i = 0; i <= at; ++i)
    if (!lines[i].empty() && lines[i].front() == '[')
      section = lines[i].substr(1, lines[i].size() - 2);
  const std::string& line = lines[at];
  if (line.empty() || line.front() == '[' || section.empty()) return line;
  return section + "." + line;
}

}  // namespace

void agree_on_config(const mpi::Comm& comm, const Config& c) {
  const std::string mine = to_ini(c);
  const uint64_t h = fingerprint(mine);
  const double hi = static_cast<double>(h >> 32), lo = static_cast<double>(h & 0xffffffffu);
  double v[4] = {hi, lo, -hi, -lo};  // max and -min of each half: exact in a double
  comm.allreduce_max(v, 4);
  if (v[0] == -v[2] && v[1] == -v[3]) return;
  std::string lead = mine;
  comm.broadcast(lead, 0);
  const std::vector<std::string> ours = lines_of(mine), theirs = lines_of(lead);
  size_t at = 0;
  while (at < ours.size() && at < theirs.size() && ours[at] == theirs[at]) ++at;
  const bool same = ours.size() == theirs.size() && at == ours.size();
  // The lowest (line, rank) that differs from rank 0: -max of the negated codes.
  const double p = comm.size();
  double code = same ? -1e15 : -(static_cast<double>(at) * p + comm.rank());
  comm.allreduce_max(&code, 1);
  if (code == -1e15) return;  // every text equal to rank 0's after all
  const int64_t first = static_cast<int64_t>(-code);
  const size_t line = static_cast<size_t>(first / comm.size());
  const int rank = static_cast<int>(first % comm.size());
  std::string other = comm.rank() == rank ? setting_at(ours, line) : std::string();
  comm.broadcast(other, rank);
  throw UsageError("the ranks were started with different settings: rank 0 has " +
                   setting_at(theirs, line) + ", rank " + std::to_string(rank) + " has " + other +
                   "; give every rank the same --config and options (an MPMD launch line gives "
                   "each part its own)");
}

}  // namespace gg::gossip
