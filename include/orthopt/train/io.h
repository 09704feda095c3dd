#pragma once
// Checked file output of the trainer (docs/checkpoints.md "Disk errors"): every byte reaches
// the file or the call throws c10::Error naming the file and the errno text ("No space left on
// device"); nothing is left half-written under a name a reader trusts.
//
// Test-only fault: ORTHOPT_FAULT_ENOSPC=<path suffix>@<bytes> makes every checked write to a
// file whose path ends with <path suffix> fail with ENOSPC once the file would grow past
// <bytes> bytes (the bytes before that are written, as on a disk that fills up part-way).

#include <torch/serialize/output-archive.h>

#include <string>

namespace orthopt::train {

// Writes all `size` bytes to `fd` (EINTR retried, short writes continued). `path` names the file
// in the error and is what the test-only fault matches.
void write_all_checked(int fd, const char* data, size_t size, const std::string& path);

// Creates or truncates `path`, writes `bytes`, fsyncs and closes it; any failure removes the
// partial file and throws.
void write_file_checked(const std::string& path, const std::string& bytes);

// The bytes of a torch archive, serialized in memory. OutputArchive::save_to(path) writes
// through a writer whose destructor throws on a short write (std::terminate on a full disk);
// this overload cannot fail part-way, and write_file_checked then reports the disk's error.
std::string archive_bytes(torch::serialize::OutputArchive& archive);

// An append-only file (metrics.jsonl): each append() writes a whole record or throws, after
// cutting the file back to its previous length, so a failed append leaves no partial line.
class AppendFile {
 public:
  explicit AppendFile(const std::string& path);  // opens (creates) for appending
  ~AppendFile();
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  void append(const std::string& bytes);
  void sync();  // fsync
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace orthopt::train
