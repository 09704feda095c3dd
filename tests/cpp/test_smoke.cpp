#include <gtest/gtest.h>
#include <torch/torch.h>

#include "orthopt/orthogonalize.h"

TEST(Smoke, OrthogonalizeShape) {
  auto G = torch::randn({8, 16});
  auto out = orthopt::orthogonalize(G);
  EXPECT_EQ(out.sizes(), G.sizes());
}
