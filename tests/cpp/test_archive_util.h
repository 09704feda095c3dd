#pragma once
// Comparison of torch archives (checkpoint files) for the trainer and disk-fault tests.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>

namespace orthopt::test {

// Every tensor and value of two torch archives, recursively, must be identical.
inline void expect_archives_equal(torch::serialize::InputArchive& a, torch::serialize::InputArchive& b,
                                  const std::string& where) {
  auto ka = a.keys(), kb = b.keys();
  std::sort(ka.begin(), ka.end());
  std::sort(kb.begin(), kb.end());
  ASSERT_EQ(ka, kb) << where;
  for (const auto& k : ka) {
    at::Tensor ta, tb;
    if (a.try_read(k, ta)) {
      ASSERT_TRUE(b.try_read(k, tb)) << where << "/" << k;
      EXPECT_TRUE(ta.sizes() == tb.sizes() && ta.scalar_type() == tb.scalar_type() && torch::equal(ta, tb))
          << where << "/" << k << " differs";
      continue;
    }
    torch::serialize::InputArchive sa, sb;
    if (a.try_read(k, sa)) {
      ASSERT_TRUE(b.try_read(k, sb)) << where << "/" << k;
      expect_archives_equal(sa, sb, where + "/" + k);
      continue;
    }
    c10::IValue va, vb;
    ASSERT_TRUE(a.try_read(k, va) && b.try_read(k, vb)) << where << "/" << k;
    EXPECT_EQ(va, vb) << where << "/" << k;
  }
}

}  // namespace orthopt::test
