// orthopt._C.dist_layout: the flat-buffer layout of the C++ DistributedOptimizer
// (orthopt::dist::build_layout) as plain Python data, and DIST_SHARD_FORMAT, the tag of its shard
// format. python/orthopt/dist.py drives its torch.distributed collectives and its copies by the
// layout and writes its shards in that format, so both engines share one layout and one format.
#include <torch/extension.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "orthopt/distributed.h"

namespace py = pybind11;

namespace orthopt::python {

namespace {

// groups: per group (algorithm, flatten, [shape, ...]); the shapes become meta tensors, which is
// all build_layout reads.
std::vector<ParamGroup> spec_groups(const py::sequence& groups) {
  std::vector<ParamGroup> out;
  for (size_t g = 0; g < groups.size(); ++g) {
    const py::object item = groups[g];
    if (!py::isinstance<py::sequence>(item) || py::isinstance<py::str>(item) || py::len(item) != 3)
      throw py::type_error("dist_layout: argument 'groups'[" + std::to_string(g) +
                           "] must be a tuple (algorithm, flatten, shapes)");
    const py::sequence spec = item.cast<py::sequence>();
    ParamGroup grp;
    try {
      grp.options.algorithm = parse_algorithm(spec[0].cast<std::string>());
    } catch (const std::exception& e) {
      throw py::value_error("dist_layout: argument 'groups'[" + std::to_string(g) + "]: algorithm: " + e.what());
    }
    grp.options.ortho.flatten = spec[1].cast<bool>();
    const py::sequence shapes = spec[2].cast<py::sequence>();
    for (size_t i = 0; i < shapes.size(); ++i) {
      const auto shape = shapes[i].cast<std::vector<int64_t>>();
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      for (int64_t d : shape)
        if (d <= 0) numel = 0;
      if (numel <= 0)
        throw py::value_error("dist_layout: argument 'groups'[" + std::to_string(g) + "] shape " +
                              std::to_string(i) + " is empty (every dimension must be >= 1)");
      grp.params.push_back(at::empty(shape, at::TensorOptions().device(at::kMeta)));
    }
    out.push_back(std::move(grp));
  }
  return out;
}

py::dict layout_dict(const dist::Layout& L) {
  py::list segments, members, runs;
  for (const auto& s : L.segments) {
    py::list owned;
    for (int r = 0; r < L.world_size; ++r) owned.append(py::make_tuple(s.owned_begin(r), s.owned_end(r)));
    py::dict d;
    d["group"] = s.group;
    d["bank"] = s.is_bank;
    d["rows"] = s.rows;
    d["cols"] = s.cols;
    d["units"] = s.units;
    d["unit_numel"] = s.unit_numel();
    d["per_rank"] = s.per_rank;
    d["chunk_offset"] = s.chunk_offset;
    d["shift"] = s.shift;
    d["owned"] = owned;
    segments.append(d);
  }
  for (const auto& m : L.members)
    members.append(py::make_tuple(m.segment, L.segments[m.segment].group, m.param, m.first_unit, m.count));
  for (const auto& r : L.runs)
    runs.append(py::make_tuple(r.group, r.param, r.param_offset, r.flat_offset, r.count, r.owner));
  py::dict out;
  out["world_size"] = L.world_size;
  out["chunk"] = L.chunk;
  out["segments"] = segments;
  out["members"] = members;
  out["runs"] = runs;
  return out;
}

}  // namespace

void register_distributed(py::module_& m) {
  m.attr("DIST_SHARD_FORMAT") = dist::kShardFormat;
  m.def(
      "dist_layout",
      [](const py::sequence& groups, int world_size) {
        if (world_size < 1)
          throw py::value_error("dist_layout: argument 'world_size' must be >= 1, got " + std::to_string(world_size));
        return layout_dict(dist::build_layout(spec_groups(groups), world_size));
      },
      py::arg("groups"), py::arg("world_size"),
      "The DistributedOptimizer's flat-buffer layout (include/orthopt/distributed.h, build_layout).\n"
      "groups: per param group (algorithm, flatten, [shape, ...]). Returns a dict: world_size, chunk\n"
      "(elements per rank), segments (dicts: group, bank, rows, cols, units, unit_numel, per_rank,\n"
      "chunk_offset, shift, owned = [(begin, end) per rank]), members ((segment, group, param,\n"
      "first_unit, count): units of a segment from a param), runs ((group, param, param_offset,\n"
      "flat_offset, count, owner): contiguous element copies between a param and the [N*chunk] buffer).");
}

}  // namespace orthopt::python
