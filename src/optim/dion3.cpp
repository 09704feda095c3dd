// Dion3 (algorithms.md §5): per bank (with the CUDA kernels where they take the tensors) and the
// per-matrix reference step.
#include "optim/optimizer_impl.h"

#include "optim/update_math.h"
#ifdef ORTHOPT_WITH_CUDA
#include "cuda/multi_tensor_cuda.h"
#include "cuda/products_cuda.h"
#endif

namespace orthopt {

using namespace optim_core;
using optim_detail::lr_adjust_factor;

// ---- Dion3 (§5)
// The lr factor of a Dion3 update: the FULL matrix shape's adjustment, and lr / sqrt(f).
double OptimizerImpl::dion3_lr_factor(const GroupOptions& o, int64_t rows, int64_t cols) {
  double factor = lr_adjust_factor(o.lr_adjust, rows, cols);
  if (o.scale_lr_by_fraction) factor /= std::sqrt(o.fraction);
  return factor;
}

// Per bank: the same operations as step_dion3_reference() on [B, rows, cols] stacks, so each
// matrix gets the same values (batched reductions, topk, gather and scatter work per slice).
void OptimizerImpl::step_dion3(size_t g, const at::Tensor& lr) {
  const auto& o = groups[g].options;
  const auto idx = active(g);
  const GroupPlan plan = plan_group(g, idx);
  if (plan.path == GroupPlan::Path::Reference) return step_dion3_reference(g, idx, lr);
#ifdef ORTHOPT_WITH_CUDA
  // The momenta and the weights through the multi-tensor kernels (one launch per bank each:
  // momentum; decay, step, master copy and skip gate) where they take every tensor.
  const bool kernels = plan.path == GroupPlan::Path::Fused;
#endif
  const std::vector<Bank>& bks = plan.banks;
  // Per bank: the selected rows [B, k], as indices into [B·rows] (flat_rows), and the selection
  // [B, k, cols]; with the take kernel also the update's row map.
  std::vector<at::Tensor> rows(bks.size()), flat(bks.size()), selected(bks.size()), row_maps(bks.size());
  for (size_t bi = 0; bi < bks.size(); ++bi) {
    const Bank& b = bks[bi];
    // 1-3: accumulate, select the k rows of largest L1 norm, error feedback on them.
    std::vector<at::Tensor> grads;
    for (size_t i : b.params) grads.push_back(groups[g].params[i].grad().detach());
    if (const at::Tensor M = owned_bank(g, b, "momentum", b.cols, b.dtype); M.defined()) {
      // In place on the bank's momenta: the same values as the stacking path below. A skipped
      // step adds -0.0 (x + -0.0 is x, bit for bit, also for -0.0) and scatters the rows back
      // unchanged.
#ifdef ORTHOPT_WITH_CUDA
      if (kernels) {
        // One launch for the bank: 1·M + 1·G is M + G exactly, skip gate in the kernel, and
        // the rows' L1 scores in the same pass (no second read of M for the selection).
        const at::Tensor scores = at::empty({b.size(), b.rows}, M.options().dtype(at::kFloat));
        std::vector<at::Tensor> momenta, row_scores;
        for (size_t j = 0; j < b.params.size(); ++j) {
          momenta.push_back(b.slice(M, j).view(grads[j].sizes()));
          row_scores.push_back(b.slice(scores, j));
        }
        cuda::momentum_rows(momenta, grads, {}, row_scores, b.cols, 1.0, 1.0, /*nesterov=*/false,
                            cuda::RowStat::L1OfMomentum, keep_flag());
        rows[bi] = optim_detail::dion3_top_rows(scores, o.fraction);
        // The gather, the error feedback and the row indices below (and the update's row
        // map) in one launch: the same values (a copy, one fp32 product).
        auto took = cuda::dion3_take_rows(M, rows[bi], o.momentum, keep_flag());
        selected[bi] = took.selected;
        flat[bi] = took.flat;
        row_maps[bi] = took.row_map;
        continue;
      }
#endif
      for (size_t j = 0; j < b.params.size(); ++j) {
        const at::Tensor G = grads[j].reshape({-1, b.rows, b.cols});
        b.slice(M, j).add_(skip_active ? at::where(keep, G, at::full({}, -0.0, G.options())) : G);
      }
      rows[bi] = optim_detail::dion3_rows(M, o.fraction);
      flat[bi] = optim_detail::flat_rows(rows[bi], b.rows);
      selected[bi] = optim_detail::take_rows(M, flat[bi]).view({b.size(), rows[bi].size(-1), b.cols});
      optim_detail::put_rows_(M, flat[bi], gated(selected[bi] * o.momentum, selected[bi]));
    } else {  // (a scope, so the bank-sized momentum temporaries are freed before the next bank's)
      const auto momenta = bank_state(g, b, "momentum");
      const at::Tensor M_old = stack_bank(momenta, b.rows, b.cols, b.dtype);
      auto sel = optim_detail::dion3_select(M_old + stack_bank(grads, b.rows, b.cols, b.dtype), o.fraction,
                                            o.momentum);
      commit_bank(b, momenta, sel.momentum, M_old);
      rows[bi] = sel.rows;
      selected[bi] = sel.selected;
      flat[bi] = optim_detail::flat_rows(rows[bi], b.rows);
    }
  }
  // 4: every bank's selection in one call (Dion3 has no split_sizes): each is an independent
  // chain of products, so on a GPU the small chains run side by side, and the Gram NS of
  // selections with the same m iterates as one batch (orthogonalize_many_in_compute_dtype).
  // All banks' selections are alive at once (Llama 1.26B, fp32: about 1.1 GB).
  const std::vector<at::Tensor> ns =
      detail::orthogonalize_many_in_compute_dtype(selected, batch_ortho_options(o.ortho));
  for (size_t bi = 0; bi < bks.size(); ++bi) {
    const Bank& b = bks[bi];
    // 5: NorMuon on the selected rows (their variances updated in place in V); 6-7: decay
    // everywhere, the step on the selected rows.
    const at::Tensor V = owned_bank(g, b, "variance", 1, at::kFloat);  // the variance is fp32
    const double factor = dion3_lr_factor(o, b.rows, b.cols);
#ifdef ORTHOPT_WITH_CUDA
    if (kernels) {
      // NorMuon by its kernels, the selected rows' variances read and written through flat
      // (no gather and scatter of V), on the NS result in its compute dtype: the reference's
      // cast to the fp32 selection widens bf16/fp16 exactly, and U · factors promotes to the
      // same fp32 products, so Û is the reference's up to the order of the sums.
      at::Tensor U = ns[bi];
      if (U.scalar_type() == at::kDouble) U = detail::cast_result(U, selected[bi].scalar_type());
      U = cuda::contiguous(U);
      const at::Tensor U_hat =
          U * cuda::normuon_factors(U, V, flat[bi], o.normuon_beta2, o.normuon_eps, keep_flag());
      // The update with a direction that is zero outside the selection, without that
      // full-size direction: the kernel reads Û's row where the row map points to one, D = 0
      // elsewhere; the same arithmetic as the zero-padded update, one pass over the weights.
      const at::Tensor D = U_hat.contiguous().view({-1, b.cols});                 // [B·k, cols]
      const at::Tensor map =
          row_maps[bi].defined()
              ? row_maps[bi]
              : at::full({b.size() * b.rows}, -1, rows[bi].options().dtype(at::kInt))
                    .index_copy_(0, flat[bi], at::arange(flat[bi].numel(), rows[bi].options().dtype(at::kInt)));
      std::vector<at::Tensor> weights, copies, directions, maps;
      for (size_t j = 0; j < b.params.size(); ++j) {
        add_weights(g, b.params[j], weights, copies);
        directions.push_back(D);  // the bank's; the map holds bank-wide row numbers
        maps.push_back(map.narrow(0, b.offsets[j] * b.rows, (b.offsets[j + 1] - b.offsets[j]) * b.rows));
      }
      cuda::update_selected(weights, directions, maps, b.cols, copies, std::vector<double>(weights.size(), factor), lr,
                            o.weight_decay, o.cautious_weight_decay, keep_flag());
      continue;
    }
#endif
    // NorMuon of the NS result in the selection's dtype (what orthogonalize() returns).
    const at::Tensor U = detail::cast_result(ns[bi], selected[bi].scalar_type());
    const at::Tensor V_sel_old = optim_detail::take_rows(V, flat[bi]).view({b.size(), rows[bi].size(-1), 1});
    auto [U_hat, V_sel_new] = optim_detail::normuon_normalize(U, V_sel_old, o.normuon_beta2, o.normuon_eps);
    optim_detail::put_rows_(V, flat[bi], gated(V_sel_new.to(at::kFloat), V_sel_old));
    std::vector<at::Tensor> storage;
    for (size_t i : b.params) storage.push_back(weight_storage(g, i));
    const at::Tensor W_old = stack_bank(storage, b.rows, b.cols, b.dtype);
    write_weights_bank(g, b,
                       optim_detail::decoupled_update_rows(W_old, rows[bi], U_hat.to(b.dtype), lr, lr * factor,
                                                           o.weight_decay, o.cautious_weight_decay),
                       W_old);
  }
}

// The per-matrix reference path of step_dion3().
void OptimizerImpl::step_dion3_reference(size_t g, const std::vector<size_t>& idx, const at::Tensor& lr) {
  const auto& o = groups[g].options;
  std::vector<at::Tensor> inputs, rows;
  for (size_t i : idx) {
    auto& st = state_of(g, i);
    const auto& p = groups[g].params[i];
    const auto msz = matrix_sizes(p, o);
    at::Tensor M = (st.at("momentum").to(work_dtype(p)) + grad_of(g, i)).reshape(msz);
    auto sel = optim_detail::dion3_select(M, o.fraction, o.momentum);
    commit(st.at("momentum"), sel.momentum.reshape(p.sizes()));
    inputs.push_back(sel.selected);
    rows.push_back(sel.rows);
  }
  const auto outs = orthogonalize_all(inputs, o.ortho);
  for (size_t j = 0; j < idx.size(); ++j) {
    const size_t i = idx[j];
    const auto& p = groups[g].params[i];
    const auto msz = matrix_sizes(p, o);
    auto& V = state_of(g, i).at("variance");
    auto [U_hat, V_sel_new] = optim_detail::normuon_normalize(
        outs[j], optim_detail::gather_rows(V, rows[j]), o.normuon_beta2, o.normuon_eps);
    commit(V, optim_detail::scatter_rows(V, rows[j], V_sel_new));
    at::Tensor W = weights(g, i);
    at::Tensor D = optim_detail::scatter_rows(at::zeros(msz, W.options()), rows[j], U_hat.to(W.scalar_type()));
    const double factor = dion3_lr_factor(o, msz[msz.size() - 2], msz.back());
    write_weights(g, i,
                  optim_detail::decoupled_update(W, D.reshape(p.sizes()), lr, lr * factor, o.weight_decay,
                                                 o.cautious_weight_decay));
  }
}

}  // namespace orthopt
