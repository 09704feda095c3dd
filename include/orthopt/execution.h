#pragma once
// How a step or an orthogonalization runs: which implementation each part takes. Every field
// defaults to Auto, the measured rule (docs/execution.md); On and Off force a path, for tests
// that compare paths and for A/B timings. A choice changes the arithmetic only as documented per
// field (fp32 summation order at most); results on the CPU are the same bits whatever is chosen
// except `banks` (see there). The optimizer decides every choice per bank in one place
// (Optimizer::plan()), and the layers below execute that plan.
#include <string>
#include <vector>

namespace orthopt {

enum class Toggle { Auto, On, Off };

struct ExecutionOptions {
  // orthopt's CUDA kernels (multi-tensor step kernels, scaled casts, symmetric and fused
  // products). Off: ATen operations only, the reference path, everywhere.
  Toggle kernels = Toggle::Auto;
  // Same-shaped matrices of a group stacked into banks [B, m, n], one operation per bank (Dion3,
  // Dion, NorMuon's statistics). Auto: on accelerators, off on the CPU (nothing is launch-bound
  // there and the large stacked temporaries cost page faults; docs/decisions/optimizer-banks.md).
  // Same bits either way on the CPU.
  Toggle banks = Toggle::Auto;
  // Muon/NorMuon on CUDA: the momentum and the Newton–Schulz input (scaled, in the 16-bit compute
  // dtype) in one kernel where the bank fits it (docs/decisions/one-pass-ns-input.md).
  Toggle fused_ns_input = Toggle::Auto;
  // Muon on CUDA: the weight update folded into the last Newton–Schulz product's epilogue, for
  // fp32 parameters without master weights and plain decoupled decay
  // (docs/decisions/fold-update.md).
  Toggle fold_update = Toggle::Auto;
  // Gram NS of a tall batch in its own layout, without transposing it (CUDA kernels, 16-bit
  // compute). Auto: where m <= 1024 (docs/decisions/gram-own-layout.md).
  Toggle gram_own_layout = Toggle::Auto;
  // Independent chains of NS products on side streams (CUDA kernels). Auto: chains of at most
  // 2e11 multiply-adds (docs/decisions/ns-side-streams.md).
  Toggle side_streams = Toggle::Auto;
  // Gram NS run on a transposed batch writes its last product back in the batch's layout
  // instead of returning a transposed view. Auto: on.
  Toggle gram_transposed_result = Toggle::Auto;
  // The last NS product writes the caller's dtype itself instead of a cast pass after it
  // (docs/decisions/ns-result-in-callers-dtype.md). Auto: on.
  Toggle direct_result = Toggle::Auto;
};

const char* to_string(Toggle t);
// "auto" | "on" | "off"; `field` names the option in the error.
Toggle parse_toggle(const std::string& s, const std::string& field);
// The field names, in declaration order.
const std::vector<std::string>& execution_fields();
Toggle get_field(const ExecutionOptions& e, const std::string& field);
// Sets one field by name; throws c10::ValueError naming an unknown field or value.
void set_field(ExecutionOptions& e, const std::string& field, const std::string& value);
// "field=value,..." (the CLI's --execution); empty or "auto": all Auto.
ExecutionOptions parse_execution(const std::string& spec);
// The fields not Auto, as "field=value,...", or "auto".
std::string to_string(const ExecutionOptions& e);
// Resolves a toggle against its measured rule.
inline bool resolve(Toggle t, bool auto_value) { return t == Toggle::Auto ? auto_value : t == Toggle::On; }

}  // namespace orthopt
