// Text data for the trainer (see include/orthopt/train/data.h).
#include "orthopt/train/data.h"

#include "orthopt/train/io.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace orthopt::train {

namespace fs = std::filesystem;

std::string default_corpus_path() {
  const char* dir = std::getenv("ORTHOPT_DATA_DIR");
  return (fs::path(dir && *dir ? dir : "data") / "kjv.txt").string();
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TORCH_CHECK(fd >= 0, "cannot create '", tmp, "': ", std::strerror(errno));
  auto fail = [&](const char* what, int err) {
    ::unlink(tmp.c_str());
    TORCH_CHECK(false, "cannot ", what, " '", path, "': ", std::strerror(err));
  };
  try {
    write_all_checked(fd, bytes.data(), bytes.size(), path);  // names the target; the fault hook matches it
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail("fsync", err);
  }
  if (::close(fd) != 0) fail("close", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("publish", errno);
}

namespace {

std::string read_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  TORCH_CHECK(fs::exists(path, ec), what, ": file '", path, "' does not exist");
  TORCH_CHECK(fs::is_regular_file(path, ec), what, ": '", path, "' is not a regular file");
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, what, ": cannot open '", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

void ensure_default_corpus(const std::string& path) {
  if (fs::exists(path)) return;
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent);
  // The whole King James Bible, Genesis 1:1 to Revelation 22:21, as the `bible` program prints it.
  FILE* pipe = ::popen("bible 'gen1:1-rev22:21' 2>/dev/null", "r");
  TORCH_CHECK(pipe, "default corpus: cannot run the 'bible' program (Debian package bible-kjv)");
  std::string text;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) text.append(buf, n);
  const int status = ::pclose(pipe);
  TORCH_CHECK(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0 && text.size() > 1000000,
              "default corpus: 'bible gen1:1-rev22:21' failed (exit status ", status, ", ", text.size(),
              " bytes); install Debian's bible-kjv and bible-kjv-text (scripts/bootstrap.sh) or pass --data FILE");
  write_file_atomically(path, text);
}

void validate_text(const std::string& bytes, const std::string& what) {
  TORCH_CHECK(!bytes.empty(), what, ": the file is empty");
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    TORCH_CHECK(c != 0, what, ": NUL byte at offset ", i, ": this looks like a binary file, not UTF-8 text");
    size_t len;
    uint32_t min_cp;
    uint32_t cp;
    if (c < 0x80) { ++i; continue; }
    else if ((c & 0xE0) == 0xC0) { len = 2; min_cp = 0x80; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { len = 3; min_cp = 0x800; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { len = 4; min_cp = 0x10000; cp = c & 0x07; }
    else { TORCH_CHECK(false, what, ": invalid UTF-8 at byte offset ", i, " (not text?)"); }
    TORCH_CHECK(i + len <= n, what, ": truncated UTF-8 sequence at byte offset ", i);
    for (size_t j = 1; j < len; ++j) {
      TORCH_CHECK((s[i + j] & 0xC0) == 0x80, what, ": invalid UTF-8 at byte offset ", i, " (not text?)");
      cp = (cp << 6) | (s[i + j] & 0x3F);
    }
    // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8.
    TORCH_CHECK(cp >= min_cp && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF), what,
                ": invalid UTF-8 at byte offset ", i, " (not text?)");
    i += len;
  }
}

Corpus load_corpus(const std::string& path, double val_fraction, int64_t context) {
  TORCH_CHECK(val_fraction > 0.0 && val_fraction < 1.0, "val_fraction: must be in (0, 1), got ", val_fraction);
  const std::string bytes = read_file(path, "--data");
  validate_text(bytes, "--data '" + path + "'");
  const int64_t n = static_cast<int64_t>(bytes.size());
  const int64_t n_val = static_cast<int64_t>(std::ceil(val_fraction * static_cast<double>(n)));
  const int64_t n_train = n - n_val;
  TORCH_CHECK(n_val >= context + 1 && n_train >= context + 1, "--data '", path, "': too short (", n,
              " bytes) for context ", context, ": the training part (", n_train, " bytes) and the validation part (",
              n_val, " bytes, val_fraction ", val_fraction, ") each need at least context+1 = ", context + 1, " bytes");
  auto all = at::empty({n}, at::kByte);
  std::memcpy(all.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  return Corpus{path, all.slice(0, 0, n_train).clone(), all.slice(0, n_train, n).clone()};
}

BatchSampler::BatchSampler(at::Tensor tokens, int64_t batch, int64_t context, uint64_t seed)
    : tokens_(std::move(tokens)), batch_(batch), context_(context), rng_(seed) {
  TORCH_CHECK(batch_ > 0, "batch_size: must be > 0, got ", batch_);
  TORCH_CHECK(tokens_.numel() >= context_ + 1, "BatchSampler: ", tokens_.numel(),
              " tokens are too few for context ", context_);
}

std::pair<at::Tensor, at::Tensor> BatchSampler::next(c10::Device device) {
  // Offsets drawn as integers straight from the generator (not through a distribution
  // object whose algorithm differs between standard libraries) so runs reproduce anywhere.
  const uint64_t range = static_cast<uint64_t>(tokens_.numel() - context_);  // offsets [0, range)
  // For a CUDA device the batch is drawn into pinned memory and copied without blocking the
  // host: a copy from pageable memory waits for the device to finish its queued work, which
  // would make every micro-batch a host synchronization. (torch's caching host allocator
  // keeps the buffer until the copy is done.)
  auto windows = at::empty({batch_, context_ + 1}, at::TensorOptions().dtype(at::kLong).pinned_memory(device.is_cuda()));
  const uint8_t* src = tokens_.data_ptr<uint8_t>();
  int64_t* dst = windows.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch_; ++b) {
    const uint64_t offset = rng_() % range;  // modulo bias < range/2^64: negligible
    for (int64_t t = 0; t <= context_; ++t) dst[b * (context_ + 1) + t] = src[offset + t];
  }
  ++batches_drawn_;
  windows = windows.to(device, /*non_blocking=*/true);
  return {windows.slice(1, 0, context_), windows.slice(1, 1, context_ + 1)};
}

std::string BatchSampler::state() const {
  std::ostringstream ss;
  ss << batches_drawn_ << ' ' << rng_;
  return ss.str();
}

void BatchSampler::set_state(const std::string& s) {
  std::istringstream ss(s);
  int64_t drawn = -1;
  std::mt19937_64 rng;
  ss >> drawn >> rng;
  TORCH_CHECK(!ss.fail() && drawn >= 0, "BatchSampler: malformed sampler state in checkpoint");
  batches_drawn_ = drawn;
  rng_ = rng;
}

std::vector<std::pair<at::Tensor, at::Tensor>> eval_batches(const at::Tensor& tokens, int64_t batch,
                                                             int64_t context, int64_t max_batches) {
  const int64_t windows = std::min((tokens.numel() - 1) / context, batch * max_batches);
  TORCH_CHECK(windows >= 1, "eval_batches: ", tokens.numel(), " tokens are too few for context ", context);
  std::vector<std::pair<at::Tensor, at::Tensor>> out;
  auto t = tokens.to(at::kLong);
  for (int64_t start = 0; start < windows; start += batch) {
    const int64_t rows = std::min(batch, windows - start);
    auto x = t.slice(0, start * context, (start + rows) * context).view({rows, context});
    auto y = t.slice(0, start * context + 1, (start + rows) * context + 1).view({rows, context});
    out.emplace_back(x, y);
  }
  return out;
}

}  // namespace orthopt::train
