// orthopt._C.Optimizer: the C++ orthopt::Optimizer for the torch.optim front ends
// (python/orthopt/optim.py). Groups arrive as dicts of plain Python values.
#include <torch/extension.h>

#include <cstring>
#include <type_traits>

#include "bindings.h"
#include "orthopt/optim.h"

namespace py = pybind11;

namespace {

using orthopt::GroupOptions;

// The option keys a group dict may carry (besides 'params' and 'param_names').
const std::vector<std::string>& option_keys() {
  static const std::vector<std::string> keys = {
      "algorithm", "lr", "weight_decay", "cautious_weight_decay", "momentum", "momentum_style", "nesterov",
      "lr_adjust", "schedule", "ns_steps", "method", "compute_dtype", "split_sizes", "flatten", "gram_restarts",
      "gram_aspect_threshold", "ns_safety", "ns_eps", "normuon_beta2", "normuon_eps", "fraction", "scale_lr_by_fraction",
      "rank_fraction", "dion_qr", "betas", "eps", "master_weights", "execution"};
  return keys;
}

// Options that may be None (the C++ default: unset / empty); every other option needs a value.
bool may_be_none(const char* key) {
  for (const char* k : {"compute_dtype", "split_sizes", "ns_safety", "ns_eps", "execution"})
    if (std::strcmp(k, key) == 0) return true;
  return false;
}

// Whether the dict sets `key` (None is "not set" only where may_be_none(key); else a TypeError).
bool given(const py::dict& d, const char* key) {
  if (!d.contains(key)) return false;
  if (!d[key].is_none()) return true;
  TORCH_CHECK_TYPE(may_be_none(key), "option '", key, "': expected a value, got None");
  return false;
}

std::string type_name(const py::handle& v) { return std::string(py::str(py::type::of(v))); }

template <typename T>
T value(const py::dict& d, const char* key, const char* expected) {
  py::object v = d[key];
  // pybind11 converts a bool to a float; a bool for a numeric option is almost surely a mistake.
  if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>)
    TORCH_CHECK_TYPE(!py::isinstance<py::bool_>(v), "option '", key, "': expected ", expected, ", got a bool");
  try {
    return v.cast<T>();
  } catch (const py::cast_error&) {
    TORCH_CHECK_TYPE(false, "option '", key, "': expected ", expected, ", cannot convert ", type_name(v));
  }
}

template <typename T>
void read(const py::dict& d, const char* key, T& out, const char* expected) {
  if (given(d, key)) out = value<T>(d, key, expected);
}

// A name option parsed by `parse` (whose unknown-name error becomes a ValueError).
template <typename F>
auto parse_name(const py::dict& d, const char* key, F parse) {
  const auto name = value<std::string>(d, key, "a str");
  try {
    return parse(name);
  } catch (const c10::ValueError&) {
    throw;
  } catch (const c10::Error& e) {
    TORCH_CHECK_VALUE(false, "option '", key, "': ", e.what_without_backtrace());
  }
}

GroupOptions options_from_dict(const py::dict& d) {
  GroupOptions o;
  if (given(d, "algorithm")) o.algorithm = parse_name(d, "algorithm", orthopt::parse_algorithm);
  read(d, "lr", o.lr, "a float");
  read(d, "weight_decay", o.weight_decay, "a float");
  read(d, "cautious_weight_decay", o.cautious_weight_decay, "a bool");
  read(d, "momentum", o.momentum, "a float");
  if (given(d, "momentum_style")) o.momentum_style = parse_name(d, "momentum_style", orthopt::parse_momentum_style);
  read(d, "nesterov", o.nesterov, "a bool");
  if (given(d, "lr_adjust")) o.lr_adjust = parse_name(d, "lr_adjust", orthopt::parse_lr_adjust);
  if (given(d, "schedule")) {
    py::object sch = d["schedule"];
    if (py::isinstance<py::str>(sch)) {
      o.ortho.schedule = sch.cast<std::string>();
    } else {
      o.ortho.schedule = "custom";
      std::vector<std::vector<double>> triples;
      try {
        triples = sch.cast<std::vector<std::vector<double>>>();
      } catch (const py::cast_error&) {
        TORCH_CHECK_TYPE(false, "option 'schedule': expected a schedule name or a sequence of (a, b, c) triples, got ",
                         type_name(sch));
      }
      for (const auto& v : triples) {
        TORCH_CHECK_VALUE(v.size() == 3, "option 'schedule': custom triples must have 3 entries (a, b, c), got ",
                          v.size());
        o.ortho.custom_triples.push_back({v[0], v[1], v[2]});
      }
    }
  }
  read(d, "ns_steps", o.ortho.steps, "an int");
  if (given(d, "method")) o.ortho.method = parse_name(d, "method", orthopt::parse_method);
  if (given(d, "compute_dtype")) {
    TORCH_CHECK_TYPE(THPDtype_Check(py::object(d["compute_dtype"]).ptr()), "option 'compute_dtype': expected a "
                     "torch.dtype or None, got ", type_name(d["compute_dtype"]));
    o.ortho.compute_dtype = orthopt::python::to_scalar_type(d["compute_dtype"], "compute_dtype");
  }
  read(d, "split_sizes", o.ortho.split_sizes, "a list of ints");
  read(d, "flatten", o.ortho.flatten, "a bool");
  read(d, "gram_restarts", o.ortho.gram_restarts, "a list of ints");
  read(d, "gram_aspect_threshold", o.ortho.gram_aspect_threshold, "a float");
  if (given(d, "ns_safety")) o.ortho.safety = value<double>(d, "ns_safety", "a float or None");
  if (given(d, "ns_eps")) o.ortho.eps = value<double>(d, "ns_eps", "a float or None");
  read(d, "normuon_beta2", o.normuon_beta2, "a float");
  read(d, "normuon_eps", o.normuon_eps, "a float");
  read(d, "fraction", o.fraction, "a float");
  read(d, "scale_lr_by_fraction", o.scale_lr_by_fraction, "a bool");
  read(d, "rank_fraction", o.rank_fraction, "a float");
  if (given(d, "dion_qr")) o.dion_qr = parse_name(d, "dion_qr", orthopt::parse_dion_qr);
  if (given(d, "betas")) {
    auto b = value<std::vector<double>>(d, "betas", "a pair of floats");
    TORCH_CHECK_VALUE(b.size() == 2, "option 'betas': expected (beta1, beta2), got ", b.size(), " values");
    o.beta1 = b[0];
    o.beta2 = b[1];
  }
  read(d, "eps", o.eps, "a float");
  read(d, "master_weights", o.master_weights, "a bool");
  if (d.contains("execution")) o.ortho.execution = orthopt::python::to_execution(d["execution"]);
  return o;
}

// GroupOptions{}'s values under the option keys (the one source of the front ends' defaults).
py::dict default_options() {
  const GroupOptions o;
  py::dict d;
  d["algorithm"] = orthopt::to_string(o.algorithm);
  d["lr"] = o.lr;
  d["weight_decay"] = o.weight_decay;
  d["cautious_weight_decay"] = o.cautious_weight_decay;
  d["momentum"] = o.momentum;
  d["momentum_style"] = orthopt::to_string(o.momentum_style);
  d["nesterov"] = o.nesterov;
  d["lr_adjust"] = orthopt::to_string(o.lr_adjust);
  d["schedule"] = o.ortho.schedule;
  d["ns_steps"] = o.ortho.steps;
  d["method"] = orthopt::to_string(o.ortho.method);
  d["compute_dtype"] = py::none();
  d["split_sizes"] = py::none();
  d["flatten"] = o.ortho.flatten;
  d["gram_restarts"] = o.ortho.gram_restarts;
  d["gram_aspect_threshold"] = o.ortho.gram_aspect_threshold;
  d["ns_safety"] = py::none();
  d["ns_eps"] = py::none();
  d["normuon_beta2"] = o.normuon_beta2;
  d["normuon_eps"] = o.normuon_eps;
  d["fraction"] = o.fraction;
  d["scale_lr_by_fraction"] = o.scale_lr_by_fraction;
  d["rank_fraction"] = o.rank_fraction;
  d["dion_qr"] = orthopt::to_string(o.dion_qr);
  d["betas"] = py::make_tuple(o.beta1, o.beta2);
  d["eps"] = o.eps;
  d["master_weights"] = o.master_weights;
  d["execution"] = py::none();
  return d;
}

std::vector<orthopt::ParamGroup> groups_from_list(const py::list& groups) {
  std::vector<orthopt::ParamGroup> out;
  for (auto item : groups) {
    auto d = item.cast<py::dict>();
    orthopt::ParamGroup g;
    try {
      g.params = d["params"].cast<std::vector<at::Tensor>>();
    } catch (const py::cast_error&) {
      TORCH_CHECK_TYPE(false, "argument 'params': expected tensors, got ", std::string(py::str(d["params"])));
    }
    if (d.contains("param_names")) g.names = d["param_names"].cast<std::vector<std::string>>();
    g.options = options_from_dict(d);
    out.push_back(std::move(g));
  }
  return out;
}

py::dict state_to_dict(const orthopt::Optimizer::StateDict& st) {
  py::dict d;
  for (const auto& [name, t] : st) d[py::str(name)] = t;
  return d;
}

}  // namespace

namespace orthopt::python {

void register_optim(py::module_& m) {
  py::class_<orthopt::Optimizer>(m, "Optimizer",
                                 "C++ orthopt::Optimizer over groups given as dicts {'params': [...], options...}")
      .def(py::init([](const py::list& groups) { return std::make_unique<orthopt::Optimizer>(groups_from_list(groups)); }),
           py::arg("groups"))
      .def("step", &orthopt::Optimizer::step, py::call_guard<py::gil_scoped_release>())
      .def("zero_grad", &orthopt::Optimizer::zero_grad, py::arg("set_to_none") = true)
      .def("set_group_options",
           [](orthopt::Optimizer& o, size_t g, const py::dict& d) { o.set_group_options(g, options_from_dict(d)); },
           py::arg("group"), py::arg("options"))
      .def("param_state", [](const orthopt::Optimizer& o, size_t g, size_t i) { return state_to_dict(o.param_state(g, i)); },
           py::arg("group"), py::arg("index"))
      .def("load_param_states",
           [](orthopt::Optimizer& o, const std::vector<std::vector<std::map<std::string, at::Tensor>>>& states) {
             o.load_param_states(states);
           },
           py::arg("states"))
      .def(
          "set_initial_q_sources",
          [](orthopt::Optimizer& o, size_t g, size_t i,
             const std::vector<std::tuple<size_t, size_t, std::vector<int64_t>, int64_t, int64_t>>& sources) {
            std::vector<orthopt::QSource> v;
            for (const auto& [sg, si, sizes, b, e] : sources) v.push_back({sg, si, sizes, b, e});
            o.set_initial_q_sources(g, i, std::move(v));
          },
          py::arg("group"), py::arg("index"), py::arg("sources"),
          "sources: [(group, index, matrix_sizes, begin, end)] of the original groups (include/orthopt/optim.h)")
      .def("set_lr_scale", &orthopt::Optimizer::set_lr_scale, py::arg("factor"))
      .def("set_skip_factor", &orthopt::Optimizer::set_skip_factor, py::arg("factor"))
      .def_property_readonly("lr_scale", &orthopt::Optimizer::lr_scale)
      .def_property_readonly("skip_factor", &orthopt::Optimizer::skip_factor)
      .def_property_readonly("step_count", &orthopt::Optimizer::step_count)
      .def_property_readonly("state_bytes", &orthopt::Optimizer::state_bytes)
      .def_property_readonly("state_version", &orthopt::Optimizer::state_version)
      .def("plan_text", [](const orthopt::Optimizer& o) { return o.plan().to_string(); })
      .def("plan_json", [](const orthopt::Optimizer& o) { return o.plan().to_json(); });
  m.def("optimizer_option_keys", &option_keys, "Option keys a param group dict may carry.");
  m.def("optimizer_option_defaults", &default_options,
        "Every option key with the C++ default (orthopt::GroupOptions); None where unset.");
  m.def(
      "route_slots",
      [](const std::vector<std::string>& names, const std::vector<at::Tensor>& params,
         const std::vector<std::string>& embedding_patterns, const std::vector<std::string>& head_patterns,
         const std::vector<std::string>& override_patterns) {
        TORCH_CHECK(names.size() == params.size(), "argument 'names': ", names.size(), " names for ", params.size(),
                    " params");
        std::vector<std::pair<std::string, at::Tensor>> named;
        for (size_t i = 0; i < names.size(); ++i) named.emplace_back(names[i], params[i]);
        return orthopt::route_slots(named, embedding_patterns, head_patterns, override_patterns);
      },
      py::arg("names"), py::arg("params"), py::arg("embedding_patterns"), py::arg("head_patterns"),
      py::arg("override_patterns"),
      "Routing slot per parameter: -1 frozen, 0 matrix, 1 flattened matrix, 2 scalar, 3 embedding/head, 4+k override k.");
}

}  // namespace orthopt::python
