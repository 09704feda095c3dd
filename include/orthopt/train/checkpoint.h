#pragma once
// Crash-safe checkpoints (algorithms.md §11, docs/checkpoints.md). A checkpoint is a directory
// <run_dir>/step_<N> published by one rename of a fully written and fsynced step_<N>.tmp/ whose
// metadata.json (written last) lists every file with its size and SHA-256. A directory without
// valid metadata, or whose files do not match it, is never treated as a checkpoint.

#include <c10/util/Optional.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace orthopt::train {

// SHA-256 (OpenSSL libcrypto) as 64 lowercase hex digits.
std::string sha256_hex(const std::string& bytes);
std::string sha256_file(const std::string& path);  // streams the file; c10::Error if unreadable
// Bytes sha256_file has read in this process (what checkpoint verification costs; tests use it).
int64_t sha256_bytes_read();

constexpr int kCheckpointFormatVersion = 1;

struct CheckpointMeta {
  int format_version = kCheckpointFormatVersion;
  int64_t step = 0;
  int64_t tokens_seen = 0;
  std::string config_sha256;
  std::string optimizer;
  std::map<std::string, std::pair<int64_t, std::string>> files;  // name -> (size, sha256)
  nlohmann::json extra;  // free-form (schedule position, data position, ...); null if unused

  nlohmann::json to_json() const;
  static CheckpointMeta from_json(const nlohmann::json& j);  // c10::Error naming a bad field
};

// A file of a checkpoint: its name inside the directory and a callback that writes it to the
// given path (e.g. torch::save / an OutputArchive's save_to).
using CheckpointFileWriter = std::function<void(const std::string& path)>;

// "<run_dir>/step_<step>"
std::string checkpoint_dir(const std::string& run_dir, int64_t step);

struct CheckpointDir {
  int64_t step;
  std::string path;
};
// The step_<N> directories of run_dir (valid or not; never *.tmp), newest first; none when
// run_dir does not exist. A name whose N does not fit int64 is skipped with a warning on stderr.
std::vector<CheckpointDir> step_directories(const std::string& run_dir);

// Removes <run_dir>/.dist_staging_<N> directories: a data-parallel save stages every rank's files
// there, and one killed between the publish and the removal leaves it behind. Call only while no
// rank is saving.
void remove_stale_staging_dirs(const std::string& run_dir);

// Publishes checkpoint `step` (docs/checkpoints.md "publish protocol"):
//  1. removes stale step_*.tmp directories left by earlier crashes;
//  2. writes every file into <run_dir>/step_<N>.tmp/ through its callback, fsyncs it and records
//     its size and SHA-256 (meta.step and meta.files are filled in here);
//  3. writes metadata.json last and fsyncs it, fsyncs the tmp directory;
//  4. renames it to step_<N> and fsyncs run_dir.
// An existing step_<N> is an error (c10::Error, nothing changed) unless overwrite = true, in which
// case it is replaced atomically. File names must be plain names (no '/'), unique, and not
// "metadata.json". A callback that throws, or a failed write (a full disk: c10::Error naming the
// file and the errno text), publishes nothing and removes the .tmp directory (best effort; a
// leftover is a stale .tmp). Callbacks should write through io.h's checked writers.
// Fault injection: ORTHOPT_FAULT_CHECKPOINT=<stage> makes the process std::_Exit(137) at that
// stage (kCheckpointFaultStages); an unknown stage name is an error.
void write_checkpoint(const std::string& run_dir, int64_t step,
                      const std::vector<std::pair<std::string, CheckpointFileWriter>>& files,
                      CheckpointMeta meta, bool overwrite = false);

// In publish order.
extern const std::vector<std::string> kCheckpointFaultStages;  // after_tmp_dir, mid_file, ...

// Checks a checkpoint directory without the config hash: name step_<N> (not .tmp), metadata.json
// parses, format version known, its step equals N, and every listed file exists with the listed
// size and SHA-256. Returns the metadata; throws c10::Error naming the file and the problem.
CheckpointMeta verify_checkpoint(const std::string& ckpt_dir);

// The newest valid checkpoint directory of run_dir by step (full path), or nullopt (also when
// run_dir does not exist). Invalid step_<N> directories are skipped with a warning on stderr
// naming the reason; *.tmp directories are never considered.
c10::optional<std::string> latest_valid_checkpoint(const std::string& run_dir);

// verify_checkpoint + the config hash must equal expected_config_sha256 (non-empty). Throws
// c10::Error ("corrupted checkpoint file X", "config mismatch: expected ... found ...") and
// changes nothing on disk.
CheckpointMeta read_checkpoint_meta(const std::string& ckpt_dir,
                                    const std::string& expected_config_sha256);

// Keeps the newest keep_last (>= 1) valid checkpoints and deletes older valid ones (each is first
// renamed to a .tmp name, so a crash mid-delete never leaves a half checkpoint named step_<N>).
// Invalid step_<N> directories are left alone (with a warning) for inspection. Never deletes the
// newest valid checkpoint. A checkpoint this process verified in full when its files were already
// settled (timestamps >= 2 s old), whose files' size, mtime, ctime and inode have not changed
// since, counts as valid without re-reading it; every other one is verified fully (reads all files).
void prune_checkpoints(const std::string& run_dir, int keep_last);

}  // namespace orthopt::train
