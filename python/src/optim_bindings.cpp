// orthopt._C.Optimizer: the C++ orthopt::Optimizer for the torch.optim front ends
// (python/orthopt/optim.py). Groups arrive as dicts of plain Python values.
#include <torch/extension.h>

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
      "rank_fraction", "dion_qr", "betas", "eps", "master_weights"};
  return keys;
}

template <typename T>
void read(const py::dict& d, const char* key, T& out) {
  if (!d.contains(key) || d[key].is_none()) return;
  try {
    out = d[key].cast<T>();
  } catch (const py::cast_error&) {
    TORCH_CHECK(false, "option '", key, "': cannot convert ", std::string(py::str(py::type::of(d[key]))));
  }
}

GroupOptions options_from_dict(const py::dict& d) {
  GroupOptions o;
  std::string s;
  if (d.contains("algorithm")) o.algorithm = orthopt::parse_algorithm(d["algorithm"].cast<std::string>());
  read(d, "lr", o.lr);
  read(d, "weight_decay", o.weight_decay);
  read(d, "cautious_weight_decay", o.cautious_weight_decay);
  read(d, "momentum", o.momentum);
  if (d.contains("momentum_style")) o.momentum_style = orthopt::parse_momentum_style(d["momentum_style"].cast<std::string>());
  read(d, "nesterov", o.nesterov);
  if (d.contains("lr_adjust")) o.lr_adjust = orthopt::parse_lr_adjust(d["lr_adjust"].cast<std::string>());
  if (d.contains("schedule")) {
    py::object sch = d["schedule"];
    if (py::isinstance<py::str>(sch)) {
      o.ortho.schedule = sch.cast<std::string>();
    } else {
      o.ortho.schedule = "custom";
      for (auto t : sch) {
        auto v = t.cast<std::vector<double>>();
        TORCH_CHECK(v.size() == 3, "option 'schedule': custom triples must have 3 entries (a, b, c), got ", v.size());
        o.ortho.custom_triples.push_back({v[0], v[1], v[2]});
      }
    }
  }
  read(d, "ns_steps", o.ortho.steps);
  if (d.contains("method")) o.ortho.method = orthopt::parse_method(d["method"].cast<std::string>());
  if (d.contains("compute_dtype") && !d["compute_dtype"].is_none())
    o.ortho.compute_dtype = orthopt::python::to_scalar_type(d["compute_dtype"], "compute_dtype");
  read(d, "split_sizes", o.ortho.split_sizes);
  read(d, "flatten", o.ortho.flatten);
  read(d, "gram_restarts", o.ortho.gram_restarts);
  read(d, "gram_aspect_threshold", o.ortho.gram_aspect_threshold);
  if (d.contains("ns_safety") && !d["ns_safety"].is_none()) o.ortho.safety = d["ns_safety"].cast<double>();
  if (d.contains("ns_eps") && !d["ns_eps"].is_none()) o.ortho.eps = d["ns_eps"].cast<double>();
  read(d, "normuon_beta2", o.normuon_beta2);
  read(d, "normuon_eps", o.normuon_eps);
  read(d, "fraction", o.fraction);
  read(d, "scale_lr_by_fraction", o.scale_lr_by_fraction);
  read(d, "rank_fraction", o.rank_fraction);
  if (d.contains("dion_qr") && !d["dion_qr"].is_none()) o.dion_qr = orthopt::parse_dion_qr(d["dion_qr"].cast<std::string>());
  if (d.contains("betas")) {
    auto b = d["betas"].cast<std::vector<double>>();
    TORCH_CHECK(b.size() == 2, "option 'betas': expected (beta1, beta2), got ", b.size(), " values");
    o.beta1 = b[0];
    o.beta2 = b[1];
  }
  read(d, "eps", o.eps);
  read(d, "master_weights", o.master_weights);
  return o;
}

std::vector<orthopt::ParamGroup> groups_from_list(const py::list& groups) {
  std::vector<orthopt::ParamGroup> out;
  for (auto item : groups) {
    auto d = item.cast<py::dict>();
    orthopt::ParamGroup g;
    g.params = d["params"].cast<std::vector<at::Tensor>>();
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
      .def_property_readonly("state_version", &orthopt::Optimizer::state_version);
  m.def("optimizer_option_keys", &option_keys, "Option keys a param group dict may carry.");
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
