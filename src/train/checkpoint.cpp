#include "orthopt/train/checkpoint.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <set>

#include "orthopt/train/io.h"

namespace fs = std::filesystem;

namespace orthopt::train {

// ---------------------------------------------------------------- SHA-256

namespace {

using DigestCtx = std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)>;

DigestCtx new_sha256() {
  DigestCtx ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  TORCH_CHECK(ctx && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1,
              "sha256: OpenSSL digest initialisation failed");
  return ctx;
}

std::string finish_hex(EVP_MD_CTX* ctx) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  TORCH_CHECK(EVP_DigestFinal_ex(ctx, digest, &len) == 1, "sha256: OpenSSL digest failed");
  std::string hex;
  hex.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

}  // namespace

std::string sha256_hex(const std::string& bytes) {
  DigestCtx ctx = new_sha256();
  TORCH_CHECK(EVP_DigestUpdate(ctx.get(), bytes.data(), bytes.size()) == 1, "sha256: update failed");
  return finish_hex(ctx.get());
}

namespace {
std::atomic<int64_t> g_bytes_hashed{0};
}  // namespace

int64_t sha256_bytes_read() { return g_bytes_hashed.load(); }

std::string sha256_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in.is_open(), "sha256_file: cannot open '", path, "'");
  DigestCtx ctx = new_sha256();
  std::vector<char> chunk(1 << 20);
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    const std::streamsize got = in.gcount();
    if (got > 0) TORCH_CHECK(EVP_DigestUpdate(ctx.get(), chunk.data(), got) == 1, "sha256: update failed");
    g_bytes_hashed += got;
  }
  TORCH_CHECK(in.eof(), "sha256_file: read error on '", path, "'");
  return finish_hex(ctx.get());
}

// ---------------------------------------------------------------- metadata

nlohmann::json CheckpointMeta::to_json() const {
  nlohmann::json files_json = nlohmann::json::object();
  for (const auto& [name, size_sha] : files)
    files_json[name] = {{"size", size_sha.first}, {"sha256", size_sha.second}};
  return {{"format_version", format_version}, {"step", step},
          {"tokens_seen", tokens_seen},       {"config_sha256", config_sha256},
          {"optimizer", optimizer},           {"files", files_json},
          {"extra", extra}};
}

CheckpointMeta CheckpointMeta::from_json(const nlohmann::json& j) {
  TORCH_CHECK(j.is_object(), "checkpoint metadata: expected a JSON object");
  auto field = [&](const char* name) -> const nlohmann::json& {
    TORCH_CHECK(j.contains(name), "checkpoint metadata: missing field '", name, "'");
    return j.at(name);
  };
  CheckpointMeta m;
  try {
    m.format_version = field("format_version").get<int>();
    m.step = field("step").get<int64_t>();
    m.tokens_seen = field("tokens_seen").get<int64_t>();
    m.config_sha256 = field("config_sha256").get<std::string>();
    m.optimizer = field("optimizer").get<std::string>();
    const nlohmann::json& files = field("files");
    TORCH_CHECK(files.is_object(), "checkpoint metadata: 'files' must be an object");
    for (const auto& [name, entry] : files.items())
      m.files[name] = {entry.at("size").get<int64_t>(), entry.at("sha256").get<std::string>()};
    m.extra = j.value("extra", nlohmann::json());
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK(false, "checkpoint metadata: malformed field: ", e.what());
  }
  return m;
}

// ---------------------------------------------------------------- filesystem helpers

namespace {

const std::regex kStepDirName(R"(step_(\d+))");
const std::regex kTmpDirName(R"(step_.*\.tmp)");
const std::regex kStagingDirName(R"(\.dist_staging_\d+)");
constexpr const char* kMetadataFile = "metadata.json";

[[noreturn]] void throw_errno(const std::string& what, const std::string& path) {
  TORCH_CHECK(false, "checkpoint: ", what, " '", path, "' failed: ", std::strerror(errno));
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw_errno("open for fsync", path);
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    throw_errno("fsync", path);
  }
  ::close(fd);
}

// Fault injection (docs/checkpoints.md): the stage named by ORTHOPT_FAULT_CHECKPOINT, read once per
// write_checkpoint call and validated so a misspelt stage fails loudly instead of never firing.
std::string requested_fault_stage() {
  const char* env = std::getenv("ORTHOPT_FAULT_CHECKPOINT");
  if (env == nullptr || *env == '\0') return "";
  const std::string stage(env);
  const auto& stages = kCheckpointFaultStages;
  TORCH_CHECK(std::find(stages.begin(), stages.end(), stage) != stages.end(),
              "ORTHOPT_FAULT_CHECKPOINT: unknown stage '", stage, "'; valid stages: ",
              fmt::format("{}", fmt::join(stages, ", ")));
  return stage;
}

// Simulated kill: no destructors, no flushing of stdio buffers, exit status 137 like SIGKILL.
void maybe_die(const std::string& requested, const char* stage) {
  if (requested == stage) std::_Exit(137);
}

// Publishes tmp as target. RENAME_NOREPLACE / RENAME_EXCHANGE make both cases one atomic step;
// where the filesystem lacks renameat2 (EINVAL/ENOSYS) a checked plain rename is used instead.
constexpr unsigned kRenameNoReplace = 1u << 0;  // linux/fs.h values, stable kernel ABI
constexpr unsigned kRenameExchange = 1u << 1;

int renameat2_raw(const std::string& from, const std::string& to, unsigned flags) {
#ifdef SYS_renameat2
  return static_cast<int>(::syscall(SYS_renameat2, AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), flags));
#else
  errno = ENOSYS;
  return -1;
#endif
}

void publish_dir(const std::string& tmp, const std::string& target, bool overwrite) {
  if (!overwrite || !fs::exists(target)) {
    if (renameat2_raw(tmp, target, kRenameNoReplace) == 0) return;
    if (errno == EEXIST) TORCH_CHECK(false, "checkpoint: '", target, "' appeared while writing; not overwritten");
    if (errno != EINVAL && errno != ENOSYS) throw_errno("rename to", target);
    TORCH_CHECK(!fs::exists(target), "checkpoint: '", target, "' appeared while writing; not overwritten");
    if (::rename(tmp.c_str(), target.c_str()) != 0) throw_errno("rename to", target);
    return;
  }
  // Replace: swap the new directory in, then delete the old one (now under the .tmp name, so a
  // crash before the delete leaves a stale .tmp that the next write removes).
  if (renameat2_raw(tmp, target, kRenameExchange) == 0) {
    fs::remove_all(tmp);
    return;
  }
  if (errno != EINVAL && errno != ENOSYS) throw_errno("exchange with", target);
  const std::string aside = target + ".replaced.tmp";
  fs::remove_all(aside);
  if (::rename(target.c_str(), aside.c_str()) != 0) throw_errno("rename aside", target);
  if (::rename(tmp.c_str(), target.c_str()) != 0) throw_errno("rename to", target);
  fs::remove_all(aside);
}

void check_file_name(const std::string& name, const std::set<std::string>& seen) {
  TORCH_CHECK(!name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
                  name.find('\0') == std::string::npos,
              "write_checkpoint: file name '", name, "' must be a plain file name (no '/')");
  TORCH_CHECK(name != kMetadataFile, "write_checkpoint: file name '", name,
              "' is reserved for the checkpoint metadata");
  TORCH_CHECK(!seen.count(name), "write_checkpoint: duplicate file name '", name, "'");
}

void remove_stale_tmp_dirs(const std::string& run_dir) {
  for (const auto& entry : fs::directory_iterator(run_dir)) {
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, kTmpDirName)) fs::remove_all(entry.path());
  }
}

using StepDir = CheckpointDir;

// step_<N> directories of run_dir, newest first (never *.tmp).
std::vector<StepDir> list_step_dirs(const std::string& run_dir) {
  std::vector<StepDir> dirs;
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) return dirs;
  for (const auto& entry : fs::directory_iterator(run_dir)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (!std::regex_match(name, m, kStepDirName) || !entry.is_directory()) continue;
    try {
      dirs.push_back({std::stoll(m[1].str()), entry.path().string()});
    } catch (const std::out_of_range&) {
      std::cerr << "orthopt: warning: ignoring '" << entry.path().string() << "': step out of range\n";
    }
  }
  std::sort(dirs.begin(), dirs.end(), [](const StepDir& a, const StepDir& b) { return a.step > b.step; });
  return dirs;
}

// Reason a checkpoint directory is invalid, or "" if valid (meta filled in then).
std::string checkpoint_problem(const std::string& ckpt_dir, CheckpointMeta* meta) {
  try {
    *meta = verify_checkpoint(ckpt_dir);
    return "";
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
}

}  // namespace

std::vector<CheckpointDir> step_directories(const std::string& run_dir) {
  try {
    return list_step_dirs(run_dir);
  } catch (const fs::filesystem_error& e) {
    TORCH_CHECK(false, "run directory '", run_dir, "': ", e.what());
  }
}

void remove_stale_staging_dirs(const std::string& run_dir) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) return;
  try {
    for (const auto& entry : fs::directory_iterator(run_dir))
      if (std::regex_match(entry.path().filename().string(), kStagingDirName)) fs::remove_all(entry.path());
  } catch (const fs::filesystem_error& e) {
    TORCH_CHECK(false, "removing stale staging directories of '", run_dir, "': ", e.what());
  }
}

const std::vector<std::string> kCheckpointFaultStages = {
    "after_tmp_dir", "mid_file",       "after_files",  "mid_metadata",
    "after_metadata", "before_rename", "after_rename"};

std::string checkpoint_dir(const std::string& run_dir, int64_t step) {
  return (fs::path(run_dir) / fmt::format("step_{}", step)).string();
}

// ---------------------------------------------------------------- verified-checkpoint record
// prune_checkpoints runs after every save and must know which checkpoints are valid; hashing all
// of them each time costs keep_last full reads per save (GBs for a 124M model with its optimizer
// state). So the process remembers each checkpoint it verified in full, with every file's
// identity at that moment (size, mtime, ctime, inode); prune trusts a record whose identities are
// unchanged and hashes everything else. A write to a file sets its ctime to the current time,
// which user space cannot set back, but at the kernel's timestamp granularity (a clock tick,
// seconds on some filesystems): so only files whose timestamps were already kSettledNs old when
// verified are recorded, and any later write gives them a newer ctime. A checkpoint is therefore
// hashed twice (when written, and by the first prune that finds it settled) instead of at every
// save. Resuming (latest_valid_checkpoint, read_checkpoint_meta) always hashes.

namespace {

struct FileId {
  int64_t size = 0, mtime_ns = 0, ctime_ns = 0;
  uint64_t ino = 0, dev = 0;
  bool operator==(const FileId& o) const {
    return size == o.size && mtime_ns == o.mtime_ns && ctime_ns == o.ctime_ns && ino == o.ino && dev == o.dev;
  }
};
using DirIds = std::map<std::string, FileId>;  // file name (metadata.json included) -> identity

constexpr int64_t kSettledNs = 2'000'000'000;  // coarser than any timestamp granularity in use

std::mutex g_verified_mutex;
std::map<std::string, DirIds> g_verified;  // checkpoint directory -> identities when found valid

bool file_id(const fs::path& path, FileId* id) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  id->size = static_cast<int64_t>(st.st_size);
  id->mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
  id->ctime_ns = static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000LL + st.st_ctim.tv_nsec;
  id->ino = static_cast<uint64_t>(st.st_ino);
  id->dev = static_cast<uint64_t>(st.st_dev);
  return true;
}

void remember_valid(const std::string& ckpt_dir, const CheckpointMeta& meta) {
  std::vector<std::string> names{kMetadataFile};
  for (const auto& f : meta.files) names.push_back(f.first);
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  const int64_t now_ns = static_cast<int64_t>(now.tv_sec) * 1000000000LL + now.tv_nsec;
  DirIds ids;
  for (const std::string& name : names) {
    FileId& id = ids[name];
    if (!file_id(fs::path(ckpt_dir) / name, &id)) return;                       // vanished
    if (now_ns - std::max(id.mtime_ns, id.ctime_ns) < kSettledNs) return;     // not settled yet
  }
  std::lock_guard<std::mutex> lock(g_verified_mutex);
  g_verified[ckpt_dir] = std::move(ids);
}

void forget(const std::string& ckpt_dir) {
  std::lock_guard<std::mutex> lock(g_verified_mutex);
  g_verified.erase(ckpt_dir);
}

bool unchanged_since_valid(const std::string& ckpt_dir) {
  std::lock_guard<std::mutex> lock(g_verified_mutex);
  const auto it = g_verified.find(ckpt_dir);
  if (it == g_verified.end()) return false;
  for (const auto& [name, id] : it->second) {
    FileId now;
    if (!file_id(fs::path(ckpt_dir) / name, &now) || !(now == id)) return false;
  }
  return true;
}

}  // namespace

// ---------------------------------------------------------------- write

static void write_and_publish(const std::string& run_dir, int64_t step, const std::string& target, const std::string& tmp,
                              const std::vector<std::pair<std::string, CheckpointFileWriter>>& files,
                              CheckpointMeta meta, bool overwrite, const std::string& fault);

static void write_checkpoint_impl(const std::string& run_dir, int64_t step,
                                  const std::vector<std::pair<std::string, CheckpointFileWriter>>& files,
                                  CheckpointMeta meta, bool overwrite) {
  TORCH_CHECK(!run_dir.empty(), "write_checkpoint: run_dir must not be empty");
  TORCH_CHECK(step >= 0, "write_checkpoint: step must be >= 0, got ", step);
  std::set<std::string> names;
  for (const auto& [name, writer] : files) {
    check_file_name(name, names);
    TORCH_CHECK(static_cast<bool>(writer), "write_checkpoint: file '", name, "' has no writer");
    names.insert(name);
  }
  const std::string fault = requested_fault_stage();
  const std::string target = checkpoint_dir(run_dir, step);
  TORCH_CHECK(overwrite || !fs::exists(target), "write_checkpoint: checkpoint '", target,
              "' already exists; refusing to overwrite it (overwrite not requested)");

  fs::create_directories(run_dir);
  remove_stale_tmp_dirs(run_dir);
  const std::string tmp = target + ".tmp";
  fs::create_directory(tmp);
  maybe_die(fault, "after_tmp_dir");
  try {
    write_and_publish(run_dir, step, target, tmp, files, std::move(meta), overwrite, fault);
  } catch (...) {
    // A failed write (a full disk, a throwing writer) gives its space back at once; whatever
    // is left here is a stale .tmp that the next write removes.
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
}

static void write_and_publish(const std::string& run_dir, int64_t step, const std::string& target, const std::string& tmp,
                              const std::vector<std::pair<std::string, CheckpointFileWriter>>& files,
                              CheckpointMeta meta, bool overwrite, const std::string& fault) {
  meta.step = step;
  meta.format_version = kCheckpointFormatVersion;
  meta.files.clear();
  for (const auto& [name, writer] : files) {
    const std::string path = (fs::path(tmp) / name).string();
    writer(path);
    TORCH_CHECK(fs::is_regular_file(path), "write_checkpoint: the writer of '", name,
                "' did not create the file '", path, "'");
    if (fault == "mid_file") {  // a kill halfway through the first file
      fs::resize_file(path, fs::file_size(path) / 2);
      std::_Exit(137);
    }
    fsync_path(path, /*directory=*/false);
    meta.files[name] = {static_cast<int64_t>(fs::file_size(path)), sha256_file(path)};
  }
  maybe_die(fault, "after_files");

  // metadata.json last: its presence (valid, with matching checksums) is what makes a checkpoint.
  const std::string meta_path = (fs::path(tmp) / kMetadataFile).string();
  const std::string text = meta.to_json().dump(2) + "\n";
  if (fault == "mid_metadata") {
    const int fd = ::open(meta_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw_errno("create", meta_path);
    write_all_checked(fd, text.data(), text.size() / 2, meta_path);
    std::_Exit(137);
  }
  write_file_checked(meta_path, text);
  maybe_die(fault, "after_metadata");

  fsync_path(tmp, /*directory=*/true);
  maybe_die(fault, "before_rename");
  publish_dir(tmp, target, overwrite);
  maybe_die(fault, "after_rename");
  fsync_path(run_dir, /*directory=*/true);
}

// ---------------------------------------------------------------- verify / find / prune

static CheckpointMeta verify_checkpoint_impl(const std::string& ckpt_dir) {
  const fs::path dir(ckpt_dir);
  const std::string name = dir.filename().string();
  std::smatch m;
  TORCH_CHECK(std::regex_match(name, m, kStepDirName), "checkpoint '", ckpt_dir,
              "': not a published checkpoint directory (expected a name step_<N>)");
  TORCH_CHECK(fs::is_directory(dir), "checkpoint '", ckpt_dir, "' is not a directory");
  const fs::path meta_path = dir / kMetadataFile;
  TORCH_CHECK(fs::is_regular_file(meta_path), "checkpoint '", ckpt_dir, "': missing ", kMetadataFile);

  nlohmann::json j;
  {
    std::ifstream in(meta_path);
    TORCH_CHECK(in.is_open(), "checkpoint '", ckpt_dir, "': cannot read ", kMetadataFile);
    j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  }
  TORCH_CHECK(!j.is_discarded(), "checkpoint '", ckpt_dir, "': ", kMetadataFile, " is not valid JSON");
  TORCH_CHECK(j.is_object() && j.contains("format_version") && j["format_version"].is_number_integer(),
              "checkpoint '", ckpt_dir, "': ", kMetadataFile, " has no integer format_version");
  const int version = j["format_version"].get<int>();
  TORCH_CHECK(version == kCheckpointFormatVersion, "checkpoint '", ckpt_dir, "': unknown format version ",
              version, " (this build reads version ", kCheckpointFormatVersion, ")");
  CheckpointMeta meta;
  try {
    meta = CheckpointMeta::from_json(j);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "checkpoint '", ckpt_dir, "': ", e.what_without_backtrace());
  }
  TORCH_CHECK(std::to_string(meta.step) == m[1].str(), "checkpoint '", ckpt_dir,
              "': metadata step ", meta.step, " does not match the directory name");
  for (const auto& [file, size_sha] : meta.files) {
    const fs::path path = dir / file;
    TORCH_CHECK(file.find('/') == std::string::npos && file != kMetadataFile,
                "checkpoint '", ckpt_dir, "': metadata lists an invalid file name '", file, "'");
    TORCH_CHECK(fs::is_regular_file(path), "corrupted checkpoint '", ckpt_dir, "': file '", file,
                "' is missing");
    const auto size = static_cast<int64_t>(fs::file_size(path));
    TORCH_CHECK(size == size_sha.first, "corrupted checkpoint '", ckpt_dir, "': file '", file, "' has ",
                size, " bytes, metadata says ", size_sha.first);
    const std::string sha = sha256_file(path.string());
    TORCH_CHECK(sha == size_sha.second, "corrupted checkpoint '", ckpt_dir, "': file '", file,
                "' has SHA-256 ", sha, ", metadata says ", size_sha.second);
  }
  remember_valid(ckpt_dir, meta);
  return meta;
}

static c10::optional<std::string> latest_valid_checkpoint_impl(const std::string& run_dir) {
  for (const StepDir& d : list_step_dirs(run_dir)) {
    CheckpointMeta meta;
    const std::string problem = checkpoint_problem(d.path, &meta);
    if (problem.empty()) return d.path;
    std::cerr << "orthopt: warning: skipping invalid checkpoint: " << problem << "\n";
  }
  return c10::nullopt;
}

CheckpointMeta read_checkpoint_meta(const std::string& ckpt_dir, const std::string& expected_config_sha256) {
  TORCH_CHECK(!expected_config_sha256.empty(),
              "read_checkpoint_meta: expected_config_sha256 must not be empty");
  CheckpointMeta meta = verify_checkpoint(ckpt_dir);
  TORCH_CHECK(meta.config_sha256 == expected_config_sha256, "checkpoint '", ckpt_dir,
              "': config mismatch: expected config sha256 ", expected_config_sha256, ", found ",
              meta.config_sha256, " (the checkpoint was written by a run with another config)");
  return meta;
}

static void prune_checkpoints_impl(const std::string& run_dir, int keep_last) {
  TORCH_CHECK(keep_last >= 1, "prune_checkpoints: keep_last must be >= 1, got ", keep_last);
  int kept = 0;
  for (const StepDir& d : list_step_dirs(run_dir)) {
    CheckpointMeta meta;
    const std::string problem = unchanged_since_valid(d.path) ? "" : checkpoint_problem(d.path, &meta);
    if (!problem.empty()) {
      std::cerr << "orthopt: warning: prune leaves invalid checkpoint alone: " << problem << "\n";
      continue;
    }
    if (kept < keep_last) {
      ++kept;
      continue;
    }
    // Disappear atomically under a stale-.tmp name, then delete.
    const std::string doomed = d.path + ".pruned.tmp";
    fs::remove_all(doomed);
    if (::rename(d.path.c_str(), doomed.c_str()) != 0) throw_errno("rename for pruning", d.path);
    forget(d.path);
    fs::remove_all(doomed);
  }
  fsync_path(run_dir, /*directory=*/true);
}

// ---------------------------------------------------------------- public entry points
// std::filesystem reports I/O problems (permissions, a file where a directory should be, a full
// disk) as std::filesystem::filesystem_error; the library's contract is c10::Error naming the call.

namespace {
template <class F>
auto filesystem_errors_as_c10(const char* call, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const fs::filesystem_error& e) {
    TORCH_CHECK(false, call, ": ", e.what());
  }
}
}  // namespace

void write_checkpoint(const std::string& run_dir, int64_t step,
                      const std::vector<std::pair<std::string, CheckpointFileWriter>>& files,
                      CheckpointMeta meta, bool overwrite) {
  filesystem_errors_as_c10("write_checkpoint",
                           [&] { write_checkpoint_impl(run_dir, step, files, std::move(meta), overwrite); });
}

CheckpointMeta verify_checkpoint(const std::string& ckpt_dir) {
  return filesystem_errors_as_c10("verify_checkpoint", [&] { return verify_checkpoint_impl(ckpt_dir); });
}

c10::optional<std::string> latest_valid_checkpoint(const std::string& run_dir) {
  return filesystem_errors_as_c10("latest_valid_checkpoint",
                                  [&] { return latest_valid_checkpoint_impl(run_dir); });
}

void prune_checkpoints(const std::string& run_dir, int keep_last) {
  filesystem_errors_as_c10("prune_checkpoints", [&] { prune_checkpoints_impl(run_dir, keep_last); });
}

}  // namespace orthopt::train
