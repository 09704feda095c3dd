// Dion2 (dion's Dion2, algorithms.md §12).
#include "optim/optimizer_impl.h"

#include "optim/update_math.h"

namespace orthopt {

using namespace optim_core;

// ---- Dion2 (dion's Dion2): Dion3's steps 1-4 and 6 without the normalization (5), selecting
// along the shorter side: rows when rows <= cols, else columns (the rows of the transpose).
// Per matrix on every device (no bank or kernel path); same-shaped selections share one
// orthogonalize() call.
void OptimizerImpl::step_dion2(size_t g, const at::Tensor& lr) {
  const auto& o = groups[g].options;
  const auto idx = active(g);
  std::vector<at::Tensor> inputs, rows;
  std::vector<bool> by_cols;
  for (size_t i : idx) {
    auto& st = state_of(g, i);
    const auto& p = groups[g].params[i];
    const auto msz = matrix_sizes(p, o);
    const bool cols = msz[msz.size() - 2] > msz.back();
    at::Tensor M = (st.at("momentum").to(work_dtype(p)) + grad_of(g, i)).reshape(msz);
    if (cols) M = M.transpose(-2, -1).contiguous();
    auto sel = optim_detail::dion3_select(M, o.fraction, o.momentum);
    at::Tensor M_new = cols ? sel.momentum.transpose(-2, -1) : sel.momentum;
    commit(st.at("momentum"), M_new.reshape(p.sizes()));
    inputs.push_back(sel.selected);
    rows.push_back(sel.rows);
    by_cols.push_back(cols);
  }
  const auto outs = orthogonalize_all(inputs, o.ortho);
  for (size_t j = 0; j < idx.size(); ++j) {
    const size_t i = idx[j];
    const auto& p = groups[g].params[i];
    const auto msz = matrix_sizes(p, o);
    at::Tensor W = weights(g, i);
    auto zeros_sizes = msz;
    if (by_cols[j]) std::swap(zeros_sizes[msz.size() - 2], zeros_sizes[msz.size() - 1]);
    at::Tensor D =
        optim_detail::scatter_rows(at::zeros(zeros_sizes, W.options()), rows[j], outs[j].to(W.scalar_type()));
    if (by_cols[j]) D = D.transpose(-2, -1);
    const double factor = dion3_lr_factor(o, msz[msz.size() - 2], msz.back());
    write_weights(g, i,
                  optim_detail::decoupled_update(W, D.reshape(p.sizes()), lr, lr * factor, o.weight_decay,
                                                 o.cautious_weight_decay));
  }
}

}  // namespace orthopt
