#include <gtest/gtest.h>

#include "orthopt/runtime.h"

int main(int argc, char** argv) {
  orthopt::init_runtime();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
