#include "orthopt/schedules.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <sstream>

namespace orthopt {
namespace {

// Raw Polar Express paper triples (t = 1..7), before the safety division.
const std::vector<Triple> kPolarExpressRaw = {
    {8.28721201814563, -23.595886519098837, 17.300387312530933},
    {4.107059111542203, -2.9478499167379106, 0.5448431082926601},
    {3.9486908534822946, -2.908902115962949, 0.5518191394370137},
    {3.3184196573706015, -2.488488024314874, 0.51004894012372},
    {2.300652019954817, -1.6689039845747493, 0.4188073119525673},
    {1.891301407787398, -1.2679958271945868, 0.37680408948524835},
    {1.8750014808534479, -1.2500016453999487, 0.3750001645474248},
};

// Divides a polynomial's coefficients so that it stays stable for inputs up to `d`
// times larger than planned: (a/d, b/d³, c/d⁵).
Triple divided(const Triple& t, double d) {
  return {t[0] / d, t[1] / std::pow(d, 3), t[2] / std::pow(d, 5)};
}

Schedule make(std::string name, std::vector<Triple> triples, double safety, double eps) {
  Schedule s;
  s.name = std::move(name);
  s.tail = triples.back();
  s.triples = std::move(triples);
  s.safety = safety;
  s.eps = eps;
  return s;
}

std::vector<Schedule> build() {
  std::vector<Schedule> out;
  out.push_back(make("jordan", {{3.4445, -4.7750, 2.0315}}, 1.0, 1e-7));
  out.push_back(make("you",
                     {{4.0848, -6.8946, 2.9270},
                      {3.9505, -6.3029, 2.6377},
                      {3.7418, -5.5913, 2.3037},
                      {2.8769, -3.1427, 1.2046},
                      {2.8366, -3.0525, 1.2012}},
                     1.0, 1e-7));
  out.push_back(make("polar_express",
                     {{8.156554524902461, -22.48329292557795, 15.878769915207462},
                      {4.042929935166739, -2.808917465908714, 0.5000178451051316},
                      {3.8916678022926607, -2.772484153217685, 0.5060648178503393},
                      {3.285753657755655, -2.3681294933425376, 0.46449024233003106},
                      {2.3465413258596377, -1.7097828382687081, 0.42323551169305323}},
                     1.02, 1e-6));
  {
    std::vector<Triple> t;
    for (const auto& raw : kPolarExpressRaw) t.push_back(divided(raw, 1.01));
    Schedule s = make("polar_express_paper", t, 1.01, 1e-7);
    s.tail = {1.875, -1.25, 0.375};  // t >= 8: undivided
    out.push_back(s);
  }
  {
    std::vector<Triple> t;
    for (int i = 0; i < 5; ++i) t.push_back(divided(kPolarExpressRaw[i], 1.05));
    out.push_back(make("gram", t, 1.0, 1e-7));
  }
  return out;
}

}  // namespace

const std::vector<Schedule>& builtin_schedules() {
  static const std::vector<Schedule> all = build();
  return all;
}

const Schedule& find_schedule(const std::string& name) {
  for (const auto& s : builtin_schedules())
    if (s.name == name) return s;
  std::ostringstream names;
  for (const auto& s : builtin_schedules()) names << (names.tellp() ? ", " : "") << s.name;
  TORCH_CHECK(false, "argument 'schedule': unknown schedule '", name, "' (known: ", names.str(),
              ", or custom triples)");
}

Schedule custom_schedule(std::vector<Triple> triples, double safety, double eps) {
  TORCH_CHECK(!triples.empty(), "argument 'schedule': custom schedule needs at least one (a, b, c) triple");
  for (const auto& t : triples)
    for (double v : t) TORCH_CHECK(std::isfinite(v), "argument 'schedule': custom triple has a non-finite coefficient");
  TORCH_CHECK(std::isfinite(safety) && safety > 0, "argument 'safety': must be finite and > 0, got ", safety);
  TORCH_CHECK(std::isfinite(eps) && eps >= 0, "argument 'eps': must be finite and >= 0, got ", eps);
  return make("custom", std::move(triples), safety, eps);
}

}  // namespace orthopt
