// Algorithm and option names, and the checks of options and parameters.
#include "optim/optimizer_impl.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <sstream>

#include "optim/update_math.h"

namespace orthopt {

using namespace optim_core;

// ---------------------------------------------------------------- names

const char* to_string(Algorithm a) {
  switch (a) {
    case Algorithm::Muon: return "muon";
    case Algorithm::NorMuon: return "normuon";
    case Algorithm::Dion3: return "dion3";
    case Algorithm::Dion: return "dion";
    case Algorithm::AdamW: return "adamw";
    case Algorithm::Lion: return "lion";
    case Algorithm::Dion2: return "dion2";
  }
  return "?";
}

Algorithm parse_algorithm(const std::string& s) {
  for (Algorithm a : {Algorithm::Muon, Algorithm::NorMuon, Algorithm::Dion3, Algorithm::Dion2, Algorithm::Dion,
                      Algorithm::AdamW, Algorithm::Lion})
    if (s == to_string(a)) return a;
  TORCH_CHECK_VALUE(false, "argument 'algorithm': unknown algorithm '", s,
                    "' (known: muon, normuon, dion3, dion2, dion, adamw, lion)");
}

const char* to_string(LrAdjust a) {
  switch (a) {
    case LrAdjust::SpectralNorm: return "spectral_norm";
    case LrAdjust::Jordan: return "jordan";
    case LrAdjust::RmsNorm: return "rms_norm";
    case LrAdjust::None: return "none";
  }
  return "?";
}

LrAdjust parse_lr_adjust(const std::string& s) {
  if (s == "spectral_norm") return LrAdjust::SpectralNorm;
  if (s == "jordan" || s == "original") return LrAdjust::Jordan;
  if (s == "rms_norm" || s == "match_rms_adamw") return LrAdjust::RmsNorm;
  if (s == "none") return LrAdjust::None;
  TORCH_CHECK_VALUE(false, "argument 'lr_adjust': unknown rule '", s,
                    "' (known: spectral_norm, jordan, rms_norm, none; torch's original, match_rms_adamw)");
}

const char* to_string(MomentumStyle m) { return m == MomentumStyle::Ema ? "ema" : "accumulate"; }

MomentumStyle parse_momentum_style(const std::string& s) {
  if (s == "accumulate") return MomentumStyle::Accumulate;
  if (s == "ema") return MomentumStyle::Ema;
  TORCH_CHECK_VALUE(false, "argument 'momentum_style': unknown style '", s, "' (known: accumulate, ema)");
}

const char* to_string(DionQr q) { return q == DionQr::Cholesky ? "cholesky" : "householder"; }

DionQr parse_dion_qr(const std::string& s) {
  if (s == "householder") return DionQr::Householder;
  if (s == "cholesky") return DionQr::Cholesky;
  TORCH_CHECK_VALUE(false, "argument 'dion_qr': unknown method '", s, "' (known: householder, cholesky)");
}

bool is_matrix_algorithm(Algorithm a) {
  return a == Algorithm::Muon || a == Algorithm::NorMuon || a == Algorithm::Dion3 || a == Algorithm::Dion2 ||
         a == Algorithm::Dion;
}

// ---------------------------------------------------------------- helpers

std::string param_label(const ParamGroup& g, size_t group, size_t index) {
  std::ostringstream s;
  if (index < g.names.size() && !g.names[index].empty())
    s << "parameter '" << g.names[index] << "' (group " << group << ")";
  else
    s << "parameter " << index << " of group " << group;
  return s.str();
}

namespace optim_core {

// Smallest eps options: nonzero in fp32 (its smallest normal number is 1.18e-38), and for
// NorMuon's normuon_eps with 1/eps² below fp32's largest number (3.4e38).
constexpr double kMinEps = 1e-38;
constexpr double kMinNormuonEps = 1e-19;

void validate_options(const GroupOptions& o, size_t group) {
  auto where = [&](const char* opt) {
    std::ostringstream s;
    s << "group " << group << " (" << to_string(o.algorithm) << "): option '" << opt << "'";
    return s.str();
  };
  const Algorithm a = o.algorithm;
  TORCH_CHECK_VALUE(std::isfinite(o.lr) && o.lr >= 0, where("lr"), " must be finite and >= 0, got ", o.lr);
  TORCH_CHECK_VALUE(std::isfinite(o.weight_decay) && o.weight_decay >= 0, where("weight_decay"),
                    " must be finite and >= 0, got ", o.weight_decay);
  if (is_matrix_algorithm(a)) {
    TORCH_CHECK_VALUE(o.momentum >= 0 && o.momentum < 1, where("momentum"), " must be in [0, 1), got ", o.momentum);
    TORCH_CHECK_VALUE(o.normuon_beta2 >= 0 && o.normuon_beta2 < 1, where("normuon_beta2"),
                      " must be in [0, 1), got ", o.normuon_beta2);
    // The eps options must be positive where a zero input would otherwise give 0/0: NorMuon's
    // U/(sqrt(V)+eps) with U = V = 0, Dion's column normalization R/(|R|+eps) with R = 0, the
    // orthogonalization's X/(|X|·safety+eps) with X = 0; and large enough to stay nonzero in fp32
    // (kMinEps), NorMuon's also to keep 1/eps² (its norm of U/(sqrt(V)+eps)) finite in fp32.
    if (a == Algorithm::NorMuon || a == Algorithm::Dion3)
      TORCH_CHECK_VALUE(std::isfinite(o.normuon_eps) && o.normuon_eps >= kMinNormuonEps, where("normuon_eps"),
                        " must be finite and >= ", kMinNormuonEps, " (a zero update would give 0/0), got ",
                        o.normuon_eps);
    if (a == Algorithm::Dion)
      TORCH_CHECK_VALUE(std::isfinite(o.eps) && o.eps >= kMinEps, where("eps"), " must be finite and >= ", kMinEps,
                        " (a zero momentum would give 0/0), got ", o.eps);
    if (o.ortho.eps)
      TORCH_CHECK_VALUE(std::isfinite(*o.ortho.eps) && *o.ortho.eps >= kMinEps, where("ns_eps"),
                        " must be finite and >= ", kMinEps, " (a zero update would give 0/0), got ", *o.ortho.eps);
    TORCH_CHECK_VALUE(o.fraction > 0 && o.fraction <= 1, where("fraction"), " must be in (0, 1], got ", o.fraction);
    TORCH_CHECK_VALUE(o.rank_fraction > 0 && o.rank_fraction <= 1, where("rank_fraction"),
                      " must be in (0, 1], got ", o.rank_fraction);
    if (a == Algorithm::Dion3 || a == Algorithm::Dion2 || a == Algorithm::Dion)
      TORCH_CHECK_VALUE(o.ortho.split_sizes.empty(), where("split_sizes"), " is not supported by ", to_string(a),
                        " (row selection / low rank act on the whole matrix)");
    try {
      (void)resolve_schedule(o.ortho);  // unknown schedule, bad overrides
    } catch (const c10::Error& e) {
      TORCH_CHECK_VALUE(false, where("ortho"), ": ", e.what_without_backtrace());
    }
  } else {
    TORCH_CHECK_VALUE(o.beta1 >= 0 && o.beta1 < 1, where("beta1"), " must be in [0, 1), got ", o.beta1);
    TORCH_CHECK_VALUE(o.beta2 >= 0 && o.beta2 < 1, where("beta2"), " must be in [0, 1), got ", o.beta2);
    if (a == Algorithm::AdamW)  // m/(sqrt(v)+eps): a zero gradient would give 0/0
      TORCH_CHECK_VALUE(std::isfinite(o.eps) && o.eps >= kMinEps, where("eps"), " must be finite and >= ", kMinEps,
                        " (a zero gradient would give 0/0), got ", o.eps);
  }
}

void validate_param(const at::Tensor& p, const GroupOptions& o, const std::string& label) {
  TORCH_CHECK_VALUE(p.defined(), label, ": undefined tensor (argument 'params')");
  TORCH_CHECK_TYPE(is_float(p.scalar_type()), label, ": expected a floating-point tensor, got ", p.scalar_type());
  TORCH_CHECK_TYPE(!p.is_sparse(), label, ": sparse parameters are not supported");
  if (!is_matrix_algorithm(o.algorithm)) return;
  TORCH_CHECK_VALUE(p.dim() >= 2, label, ": a ", p.dim(), "-D tensor (shape ", p.sizes(), ") cannot be in a '",
                    to_string(o.algorithm),
                    "' group (option 'algorithm' needs a matrix or a stack of matrices); route it to adamw or lion");
  if (o.algorithm == Algorithm::Dion3 || o.algorithm == Algorithm::Dion2 || o.algorithm == Algorithm::Dion) return;
  OrthoOptions ortho = o.ortho;
  ortho.nonfinite = NonFinitePolicy::Propagate;  // no data access at construction
  ortho.flatten = false;
  const auto msz = matrix_sizes(p, o);
  try {
    validate_ortho_args(at::empty(msz, at::TensorOptions().dtype(p.scalar_type()).device(at::kMeta)), ortho);
  } catch (const c10::Error& e) {
    TORCH_CHECK_VALUE(false, label, ": option 'ortho': ", e.what_without_backtrace());
  }
}

// True when b differs from a only in scalar hyperparameters (lr, decay, betas, ...), so the
// per-parameter checks (shapes, split sizes, state shapes) cannot change their outcome. An LR
// scheduler changes lr every step; this keeps set_group_options cheap for it.
bool same_structure(const GroupOptions& a, const GroupOptions& b) {
  const auto& x = a.ortho;
  const auto& y = b.ortho;
  return a.algorithm == b.algorithm && a.rank_fraction == b.rank_fraction && a.master_weights == b.master_weights &&
         x.schedule == y.schedule && x.custom_triples == y.custom_triples && x.steps == y.steps &&
         x.method == y.method && x.compute_dtype == y.compute_dtype && x.gram_restarts == y.gram_restarts &&
         x.gram_aspect_threshold == y.gram_aspect_threshold && x.safety == y.safety && x.eps == y.eps &&
         x.split_sizes == y.split_sizes && x.flatten == y.flatten;
}

}  // namespace optim_core

}  // namespace orthopt
