#pragma once
// Byte-level text data for the trainer: the default corpus (King James Bible from Debian's
// bible-kjv), validation of user files, a deterministic train/validation split and a seeded
// batch sampler whose state goes into checkpoints.

#include <ATen/ATen.h>

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace orthopt::train {

// Where the default corpus is cached: $ORTHOPT_DATA_DIR/kjv.txt, else data/kjv.txt under the
// current directory.
std::string default_corpus_path();

// Makes sure the default corpus exists at `path`: if it does not, runs
// `bible "gen1:1-rev22:21"` (Debian bible-kjv) and writes its output atomically (temporary
// file, fsync, rename). Throws with the reason when the program is missing or fails.
void ensure_default_corpus(const std::string& path);

// Writes `bytes` to `path` so that a reader sees the old file or the whole new one (temporary
// file in the same directory, fsync, rename).
void write_file_atomically(const std::string& path, const std::string& bytes);

// Throws c10::Error naming `what` (e.g. "--data") when `bytes` is empty, holds a NUL byte or
// is not valid UTF-8 (with the byte offset of the first bad sequence).
void validate_text(const std::string& bytes, const std::string& what);

struct Corpus {
  std::string path;
  at::Tensor train;  // uint8 [n_train]
  at::Tensor val;    // uint8 [n_val]: the last val_fraction of the file
};

// Reads and validates a UTF-8 text file and splits it: the last ceil(val_fraction·n) bytes
// are the validation set. Both parts must hold at least context+1 bytes.
Corpus load_corpus(const std::string& path, double val_fraction, int64_t context);

// Samples [batch, context] windows at uniformly random offsets of `tokens` with a 64-bit
// Mersenne Twister seeded by `seed`; inputs are the window, targets the window shifted by one.
class BatchSampler {
 public:
  BatchSampler(at::Tensor tokens, int64_t batch, int64_t context, uint64_t seed);
  // int64 inputs and targets on `device`.
  std::pair<at::Tensor, at::Tensor> next(c10::Device device = c10::kCPU);
  int64_t batches_drawn() const { return batches_drawn_; }
  // Generator state and position as text (for checkpoints); set_state restores both.
  std::string state() const;
  void set_state(const std::string& s);

 private:
  at::Tensor tokens_;
  int64_t batch_, context_;
  std::mt19937_64 rng_;
  int64_t batches_drawn_ = 0;
};

// Deterministic evaluation batches: consecutive non-overlapping windows from the start of
// `tokens`, at most max_batches batches of `batch` windows (fewer when the text is short).
std::vector<std::pair<at::Tensor, at::Tensor>> eval_batches(const at::Tensor& tokens, int64_t batch,
                                                             int64_t context, int64_t max_batches);

}  // namespace orthopt::train
