#pragma once
// Newton–Schulz coefficient schedules (algorithms.md §1). One definition per schedule.

#include <array>
#include <string>
#include <vector>

namespace orthopt {

using Triple = std::array<double, 3>;  // (a, b, c): X <- a·X + (b·A + c·A²)·X

struct Schedule {
  std::string name;
  std::vector<Triple> triples;  // step t uses triples[t]
  Triple tail;                  // steps beyond triples.size() use this (default: the last triple)
  double safety = 1.0;          // X = G / (‖G‖_F·safety + eps)
  double eps = 1e-7;

  const Triple& at_step(int t) const {
    return t < static_cast<int>(triples.size()) ? triples[t] : tail;
  }
};

// The named schedules: jordan, you, polar_express (default), polar_express_paper, gram.
const std::vector<Schedule>& builtin_schedules();

// Looks a schedule up by name; throws c10::Error naming the argument and the valid names.
const Schedule& find_schedule(const std::string& name);

// A user-given schedule ("custom"); the tail repeats the last triple.
Schedule custom_schedule(std::vector<Triple> triples, double safety, double eps);

}  // namespace orthopt
