// `orthopt train` (docs/training.md): train() and the pieces of a run that `orthopt bench train`
// reuses. The run's steps: trainer_setup.cpp and trainer_step.cpp.
#include "orthopt/train/trainer.h"

#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>

#include "core/torch_version.h"
#include "orthopt/optim.h"
#include "orthopt/runtime.h"
#include "trainer_internal.h"

namespace orthopt::train {

double bits_per_byte(double loss_nats) { return loss_nats / std::log(2.0); }

Bf16Autocast::Bf16Autocast(bool on) : on_(on) {
  if (!on_) return;
#if ORTHOPT_TORCH_AT_LEAST(2, 4)
  prev_ = at::autocast::is_autocast_enabled(at::kCUDA);
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
#else
  prev_ = at::autocast::is_enabled();
  at::autocast::set_enabled(true);
  at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
#endif
  at::autocast::increment_nesting();
}

Bf16Autocast::~Bf16Autocast() {
  if (!on_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if ORTHOPT_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(at::kCUDA, prev_);
#else
  at::autocast::set_enabled(prev_);
#endif
}

// On CUDA a data-parallel rank (LOCAL_RANK from `--nproc` or an external launcher) takes GPU
// LOCAL_RANK mod the device count, so the ranks of one host do not all share GPU 0.
c10::Device pick_device(const std::string& d) {
  if (d == "cpu") return c10::kCPU;
  const bool cuda = torch::cuda::is_available();
  TORCH_CHECK(cuda || d != "cuda", "device: cuda requested but this torch has no usable CUDA device");
  if (!cuda) return c10::kCPU;
  const char* local_rank = std::getenv("WORLD_SIZE") ? std::getenv("LOCAL_RANK") : nullptr;
  const int64_t count = static_cast<int64_t>(torch::cuda::device_count());
  const int64_t index = local_rank ? std::strtoll(local_rank, nullptr, 10) % count : 0;
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

namespace {

// torch's strict deterministic mode for the duration of a run (`deterministic`): an operation
// without a deterministic implementation throws instead of running. cuBLAS needs a fixed
// workspace configuration to be reproducible, which is read when the process first uses it, so
// it is set before the run's first CUDA work (a value the user set is kept).
class DeterministicKernels {
 public:
  explicit DeterministicKernels(bool on) : on_(on) {
    if (!on_) return;
    prev_ = at::globalContext().deterministicAlgorithms();
    prev_warn_only_ = at::globalContext().deterministicAlgorithmsWarnOnly();
    ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  }
  ~DeterministicKernels() {
    if (on_) at::globalContext().setDeterministicAlgorithms(prev_, prev_warn_only_);
  }
  DeterministicKernels(const DeterministicKernels&) = delete;
  DeterministicKernels& operator=(const DeterministicKernels&) = delete;

 private:
  bool on_;
  bool prev_ = false, prev_warn_only_ = false;
};

}  // namespace

ModelConfig model_config_of(const TrainConfig& c) {
  ModelConfig m = model_preset(c.preset);
  if (c.context > 0) m.context = c.context;
  m.n_experts = c.n_experts;
  m.top_k = c.top_k;
  m.router_bias_rate = c.router_bias_rate;
  m.router_z_loss = c.router_z_loss;
  m.activation_checkpointing = c.activation_checkpointing;
  validate_model_config(m);
  return m;
}

// Matrices inside blocks get `algorithm`; embeddings, head, norms and routers AdamW.
std::vector<ParamGroup> make_param_groups(const Transformer& model, const TrainConfig& c) {
  RoutingOptions routing;
  routing.scalar.lr = c.scalar_lr;
  GroupOptions& m = routing.matrix;
  const bool matrix_alg = c.algorithm != "adamw" && c.algorithm != "lion";
  m.algorithm = matrix_alg ? parse_algorithm(c.algorithm) : Algorithm::Muon;
  m.lr = c.lr;
  m.weight_decay = c.weight_decay;
  m.momentum = c.momentum;
  m.dion_qr = parse_dion_qr(c.dion_qr);
  m.scale_lr_by_fraction = c.algorithm == "dion3";  // lr transfer across fractions (§5.7)
  m.fraction = c.fraction;
  m.ortho.nonfinite = NonFinitePolicy::Propagate;   // the firewall looks at the grad norm
  m.ortho.execution = parse_execution(c.execution);
  routing.scalar.ortho.execution = m.ortho.execution;
  auto groups = model->param_groups(routing);
  if (!matrix_alg) {
    // Elementwise baselines: the matrix groups take the scalar optimizer with the matrix lr/wd.
    for (auto& g : groups) {
      if (!is_matrix_algorithm(g.options.algorithm)) continue;
      GroupOptions o = routing.scalar;
      o.algorithm = parse_algorithm(c.algorithm);
      o.lr = c.lr;
      o.weight_decay = c.weight_decay;
      g.options = o;
    }
  }
  return groups;
}

// The run's steps and the state they share: trainer_internal.h.
TrainResult train(const TrainConfig& config, std::ostream& log) {
  validate(config);
  TrainConfig c = config;
  if (c.lr == 0.0) c.lr = default_matrix_lr(c.algorithm);  // the hash sees the lr actually used
  const ModelConfig mcfg = model_config_of(c);
  const DeterministicKernels deterministic(c.deterministic);
  const c10::Device device = pick_device(c.device);
  TORCH_CHECK(!c.cuda_graph || device.is_cuda(), "cuda_graph: needs a CUDA device; device '", c.device,
              "' resolved to ", device);
  TORCH_CHECK(!c.tf32 || device.is_cuda(), "tf32: needs a CUDA device; device '", c.device, "' resolved to ", device);
  const Tf32Products tf32(c.tf32);
  TORCH_CHECK(!c.cuda_graph || !std::getenv("WORLD_SIZE"),
              "cuda_graph: not available in data-parallel runs (WORLD_SIZE is set): the distributed step's "
              "collectives are not captured");

  using namespace trainer_detail;
  TrainRun run(c, mcfg, device, log);
  open_data(run);
  prepare_run_dir(run);  // before anything is written
  build_model(run);
  resume_or_start(run);
  run.model->train();
  run.t_start = Clock::now();
  while (run.step < run.end_step) train_step(run);
  return finish(run);
}

}  // namespace orthopt::train
