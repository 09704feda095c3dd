#pragma once
// The execution plan of an optimizer step (Optimizer::plan()): per group and bank, the path the
// step takes, how its matrices are orthogonalized, which fused kernels run, and estimates of the
// work. The step executes the same decisions (OptimizerImpl::plan_group); `orthopt plan` and
// Python's opt.plan() print them, and the benchmarks record them in their JSON.
#include <cstdint>
#include <string>
#include <vector>

namespace orthopt {

struct BankPlan {
  size_t group = 0;
  std::string algorithm;
  std::vector<size_t> params;  // indices in the group
  // Matrix algorithms: `matrices` matrices of rows×cols. Scalar ones (adamw, lion): the group's
  // tensors as one list, `matrices` tensors of `numel` elements in all (rows = cols = 0).
  int64_t matrices = 0, rows = 0, cols = 0, numel = 0;
  std::string dtype;  // the parameters' dtype
  // fused: orthopt's CUDA kernels; banked: ATen operations per bank; reference: per matrix.
  std::string path;
  // Newton–Schulz (empty for the algorithms without it; Dion: its power iteration and QR): method,
  // compute dtype, and for tall matrices (rows > cols) whether NS works on the transpose or in the
  // matrix's layout.
  std::string ns_method, ns_dtype, layout;
  int64_t ns_rows = 0;        // rows NS sees (Dion3: the selected rows; Dion: the rank r)
  bool side_stream = false;   // its chain of products runs on a side stream
  std::vector<std::string> kernels;  // the fused kernels and epilogues this bank's step runs
  double flops = 0;  // estimated: products (NS, Dion's power iteration) and elementwise work
  double bytes = 0;  // estimated bytes read and written in device memory (NS operands excluded)
};

struct StepPlan {
  std::string device;
  std::string execution;  // the options' ExecutionOptions, as to_string() writes them
  std::vector<BankPlan> banks;
  double flops() const;
  double bytes() const;
  std::string to_string() const;  // a table, one line per bank
  std::string to_json() const;
};

}  // namespace orthopt
