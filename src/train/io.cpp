// Checked file output of the trainer (include/orthopt/train/io.h).
#include "orthopt/train/io.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace orthopt::train {

namespace {

[[noreturn]] void throw_write_error(const std::string& what, const std::string& path, int err) {
  TORCH_CHECK(false, "cannot ", what, " '", path, "': ", std::strerror(err));
}

// The byte limit of the test-only ENOSPC fault for `path`, or -1 (no fault for this file).
int64_t fault_limit(const std::string& path) {
  const char* env = std::getenv("ORTHOPT_FAULT_ENOSPC");
  if (env == nullptr || *env == '\0') return -1;
  const std::string spec(env);
  const size_t at = spec.rfind('@');
  TORCH_CHECK(at != std::string::npos && at > 0 && at + 1 < spec.size(),
              "ORTHOPT_FAULT_ENOSPC: expected <path suffix>@<bytes>, got '", spec, "'");
  const std::string suffix = spec.substr(0, at);
  char* end = nullptr;
  const long long limit = std::strtoll(spec.c_str() + at + 1, &end, 10);
  TORCH_CHECK(*end == '\0' && limit >= 0, "ORTHOPT_FAULT_ENOSPC: bad byte count in '", spec, "'");
  const bool match = path.size() >= suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
  return match ? limit : -1;
}

}  // namespace

void write_all_checked(int fd, const char* data, size_t size, const std::string& path) {
  size_t allowed = size;
  const int64_t limit = fault_limit(path);
  if (limit >= 0) {
    struct stat st {};
    TORCH_CHECK(::fstat(fd, &st) == 0, "cannot stat '", path, "': ", std::strerror(errno));
    allowed = static_cast<size_t>(std::clamp<int64_t>(limit - static_cast<int64_t>(st.st_size), 0, static_cast<int64_t>(size)));
  }
  size_t done = 0;
  while (done < allowed) {
    const ssize_t n = ::write(fd, data + done, allowed - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_write_error("write", path, errno);
    if (n == 0) throw_write_error("write", path, EIO);
    done += static_cast<size_t>(n);
  }
  if (done < size) throw_write_error("write", path, ENOSPC);  // the injected fault
}

void write_file_checked(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_write_error("create", path, errno);
  try {
    write_all_checked(fd, bytes.data(), bytes.size(), path);
    if (::fsync(fd) != 0) throw_write_error("fsync", path, errno);
  } catch (...) {
    ::close(fd);
    ::unlink(path.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(path.c_str());
    throw_write_error("close", path, err);
  }
}

std::string archive_bytes(torch::serialize::OutputArchive& archive) {
  std::ostringstream out(std::ios::binary);
  archive.save_to(out);
  TORCH_CHECK(out.good(), "cannot serialize an archive in memory");
  return out.str();
}

AppendFile::AppendFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_write_error("open for appending", path, errno);
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

void AppendFile::append(const std::string& bytes) {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw_write_error("stat", path_, errno);
  try {
    write_all_checked(fd_, bytes.data(), bytes.size(), path_);
  } catch (...) {
    // Best effort: a shorter file needs no new space, so this normally succeeds on a full disk.
    if (::ftruncate(fd_, st.st_size) != 0) {
    }
    throw;
  }
}

void AppendFile::sync() {
  if (::fsync(fd_) != 0) throw_write_error("fsync", path_, errno);
}

}  // namespace orthopt::train
