#pragma once
// ATen glue over orthopt_householder_panel (kernels/include/orthopt/kernels/householder.h): the
// panel step of the blocked Householder QR in src/optim/update_math.cpp. Compiled only when torch
// has CUDA and the kernels are built (ORTHOPT_WITH_CUDA).
#ifdef ORTHOPT_WITH_CUDA
#include <ATen/ATen.h>

namespace orthopt::cuda {

// The most rows a panel of `cols` (1..32) columns may have on `device`; 0 otherwise.
int64_t householder_panel_max_rows(int64_t cols, const at::Device& device);

// Waves of one launch of `batch` panels [rows, cols] on `device` (the fewer, the more of the
// GPU each panel's columns use); 0 where the kernel cannot take the panel.
int64_t householder_panel_waves(int64_t batch, int64_t rows, int64_t cols, const at::Device& device);

// V [B, rows, cols] (fp32, contiguous) of the panel A [B, rows, cols]: fp32 on a CUDA device,
// any batch stride, rows with unit column stride (e.g. a narrow() of a contiguous batch).
at::Tensor householder_panel(const at::Tensor& A);

// The same V written into `V` (A's sizes, rows of unit column stride, e.g. the blocked QR's
// narrow() of its V; must not overlap A).
void householder_panel_into(const at::Tensor& A, at::Tensor& V);

// T [B, n, n] of the compact WY form of n <= 32 reflectors (τ = 2/‖v‖²) from their Gram matrix
// G = VᵀV [B, n, n] (fp32 CUDA; unit column stride; only G's upper triangle is read), written
// into `T` (rows of unit column stride, e.g. a block of the blocked QR's T; must not overlap G).
void householder_t_factor_into(const at::Tensor& G, at::Tensor& T);

}  // namespace orthopt::cuda
#endif
