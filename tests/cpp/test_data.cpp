// Trainer data: text validation, the train/validation split, the seeded batch sampler and
// the default corpus.
#include "test_util.h"
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "orthopt/train/data.h"

using namespace orthopt::train;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("orthopt_test_data_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path / name, std::ios::binary) << bytes;
    return (path / name).string();
  }
};

using orthopt::test::error_of;

}  // namespace

TEST(Data, ValidateTextRejectsBinaryAndBadUtf8) {
  EXPECT_EQ(error_of([] { validate_text("plain ascii\n", "--data"); }), "");
  EXPECT_EQ(error_of([] { validate_text("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80", "--data"); }), "");  // é € 😀
  EXPECT_NE(error_of([] { validate_text("", "--data"); }).find("empty"), std::string::npos);
  EXPECT_NE(error_of([] { validate_text(std::string("ab\0cd", 5), "--data"); }).find("NUL byte at offset 2"), std::string::npos);
  EXPECT_NE(error_of([] { validate_text("ok \xFF", "--data"); }).find("invalid UTF-8 at byte offset 3"), std::string::npos);
  EXPECT_NE(error_of([] { validate_text("\xC0\x80", "--data"); }).find("invalid UTF-8"), std::string::npos);      // overlong
  EXPECT_NE(error_of([] { validate_text("\xED\xA0\x80", "--data"); }).find("invalid UTF-8"), std::string::npos);  // surrogate
  EXPECT_NE(error_of([] { validate_text("abc\xE2\x82", "--data"); }).find("truncated"), std::string::npos);
  EXPECT_NE(error_of([] { validate_text("\x80", "--data"); }).find("--data"), std::string::npos);  // names the argument
}

TEST(Data, LoadCorpusSplitsAndChecksLength) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 200; ++i) text += "line " + std::to_string(i) + " of the text\n";
  const auto path = dir.write("t.txt", text);
  const Corpus c = load_corpus(path, 0.05, 16);
  const int64_t n = static_cast<int64_t>(text.size());
  const int64_t n_val = static_cast<int64_t>(std::ceil(0.05 * n));
  ASSERT_EQ(c.val.numel(), n_val);
  ASSERT_EQ(c.train.numel(), n - n_val);
  // The split is the file itself: train is the prefix, val the suffix.
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(c.train.data_ptr<uint8_t>()), c.train.numel()), text.substr(0, n - n_val));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(c.val.data_ptr<uint8_t>()), c.val.numel()), text.substr(n - n_val));

  EXPECT_NE(error_of([&] { load_corpus((dir.path / "missing.txt").string(), 0.05, 16); }).find("does not exist"), std::string::npos);
  EXPECT_NE(error_of([&] { load_corpus(dir.write("empty.txt", ""), 0.05, 16); }).find("empty"), std::string::npos);
  EXPECT_NE(error_of([&] { load_corpus(dir.write("bin.txt", std::string("\x7f" "ELF\0\0", 6)), 0.05, 16); }).find("NUL"), std::string::npos);
  // 5% of this text is 255 bytes: too short for a 256-byte context.
  EXPECT_NE(error_of([&] { load_corpus(path, 0.05, 256); }).find("too short"), std::string::npos);
  EXPECT_NE(error_of([&] { load_corpus(dir.path.string(), 0.05, 16); }).find("not a regular file"), std::string::npos);
}

TEST(Data, SamplerIsSeededAndResumable) {
  auto tokens = torch::randint(0, 256, {5000}, torch::kLong).to(torch::kByte);
  BatchSampler a(tokens, 4, 32, 7), b(tokens, 4, 32, 7), other(tokens, 4, 32, 8);
  auto [xa, ya] = a.next();
  auto [xb, yb] = b.next();
  auto [xo, yo] = other.next();
  EXPECT_TRUE(torch::equal(xa, xb));
  EXPECT_FALSE(torch::equal(xa, xo));
  EXPECT_EQ(xa.sizes(), (std::vector<int64_t>{4, 32}));
  EXPECT_EQ(xa.scalar_type(), torch::kLong);
  // Targets are the inputs shifted by one, both taken from the text.
  EXPECT_TRUE(torch::equal(xa.slice(1, 1, 32), ya.slice(1, 0, 31)));
  for (int64_t r = 0; r < 4; ++r) {
    bool found = false;
    for (int64_t o = 0; o + 33 <= tokens.numel() && !found; ++o)
      found = torch::equal(tokens.slice(0, o, o + 32).to(torch::kLong), xa[r]) &&
              tokens[o + 32].item<int64_t>() == ya[r][31].item<int64_t>();
    EXPECT_TRUE(found) << "row " << r << " is not a window of the text";
  }
  // State round trip: a restored sampler continues exactly like the original.
  a.next();
  const std::string state = a.state();
  auto expect1 = a.next(), expect2 = a.next();
  BatchSampler restored(tokens, 4, 32, 999);
  restored.set_state(state);
  EXPECT_EQ(restored.batches_drawn(), 2);
  auto got1 = restored.next(), got2 = restored.next();
  EXPECT_TRUE(torch::equal(expect1.first, got1.first));
  EXPECT_TRUE(torch::equal(expect2.second, got2.second));
  EXPECT_THROW(restored.set_state("garbage"), c10::Error);
}

TEST(Data, EvalBatchesAreConsecutiveWindows) {
  auto tokens = torch::arange(0, 100, torch::kLong).to(torch::kByte);
  auto batches = eval_batches(tokens, 2, 10, 3);  // 6 windows of 10 from 100 bytes
  ASSERT_EQ(batches.size(), 3u);
  for (size_t b = 0; b < 3; ++b)
    for (int64_t r = 0; r < 2; ++r) {
      const int64_t start = (static_cast<int64_t>(b) * 2 + r) * 10;
      EXPECT_EQ(batches[b].first[r][0].item<int64_t>(), start);
      EXPECT_EQ(batches[b].second[r][9].item<int64_t>(), start + 10);
    }
  auto few = eval_batches(tokens, 4, 30, 10);  // only 3 windows fit
  ASSERT_EQ(few.size(), 1u);
  EXPECT_EQ(few[0].first.size(0), 3);
}

TEST(Data, DefaultCorpusIsTheKingJamesBible) {
  // scripts/bootstrap.sh installs `bible` (CI, main job); the GPU machine has no apt to get it.
  if (std::system("command -v bible >/dev/null 2>&1") != 0) GTEST_SKIP() << "the 'bible' program is not installed";
  TempDir dir;
  const std::string path = (dir.path / "sub" / "kjv.txt").string();
  ensure_default_corpus(path);
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_GT(text.size(), 4000000u);
  EXPECT_NE(text.find("In the beginning God created the heaven and the earth."), std::string::npos);
  EXPECT_NE(text.find("The grace of our Lord Jesus Christ be with you all. Amen."), std::string::npos);
  EXPECT_EQ(error_of([&] { validate_text(text, "kjv"); }), "");
  for (const auto& e : fs::directory_iterator(dir.path / "sub")) EXPECT_EQ(e.path().filename(), "kjv.txt");  // no temp left
  // An existing file is used as is.
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "cached";
  ensure_default_corpus(path);
  std::ifstream again(path);
  std::string cached((std::istreambuf_iterator<char>(again)), std::istreambuf_iterator<char>());
  EXPECT_EQ(cached, "cached");
}
