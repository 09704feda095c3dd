// Sharded optimizer checkpoints of the DistributedOptimizer, loadable at any world size.
//
// Rank r writes optim_shard_<r>.pt (state tensors of its pieces, named piece<j>_<state> for the
// j-th piece of the shard; here piece j is segment j) and optim_shard_<r>.json (the layout: every
// segment, the global range of each piece, the state names). The Python engine's state_dict() is
// the same format with one piece per owned matrix or scalar range. A piece of a bank covers whole matrices [begin, end): every state tensor of the local
// parameter has the matrices on dim 0 (momentum [n,m,k], variance [n,m,1], Q [n,k,r], master),
// and a piece of a scalar vector covers elements [begin, end) (exp_avg, exp_avg_sq: [n]); 0-d
// tensors (AdamW's step) are the same for every piece of a group. Loading at another world size
// therefore concatenates the overlapping dim-0 slices of the old pieces for each new piece.
#include <fcntl.h>
#include <unistd.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/serialize.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include "orthopt/distributed.h"
#include "orthopt/train/io.h"

namespace orthopt::dist {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string shard_pt(const std::string& dir, int r) { return (fs::path(dir) / fmt::format("optim_shard_{}.pt", r)).string(); }
std::string shard_json(const std::string& dir, int r) {
  return (fs::path(dir) / fmt::format("optim_shard_{}.json", r)).string();
}

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  TORCH_CHECK(fd >= 0, "checkpoint: cannot open '", path, "' to sync it");
  const int rc = ::fsync(fd);
  ::close(fd);
  TORCH_CHECK(rc == 0, "checkpoint: fsync of '", path, "' failed");
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK(in, "checkpoint: cannot read '", path, "'");
  try {
    return json::parse(in);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "checkpoint: '", path, "' is not valid JSON: ", e.what());
  }
}

json segments_json(const std::vector<ShardPiece>& pieces, const std::vector<int64_t>& units) {
  json segs = json::array();
  for (size_t k = 0; k < pieces.size(); ++k)
    segs.push_back({{"group", pieces[k].group}, {"bank", pieces[k].is_bank}, {"rows", pieces[k].rows},
                    {"cols", pieces[k].cols}, {"units", units[k]}});
  return segs;
}

}  // namespace

void DistributedOptimizer::save_shard(const std::string& dir) const {
  const int rank = ctx_->rank();
  torch::serialize::OutputArchive ar;
  json pieces = json::array();
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const auto& p = pieces_[k];
    json names = json::array();
    if (p.local_index >= 0) {
      const auto& st = local_->param_state(local_group_of_[p.group], p.local_index);
      for (const auto& [name, t] : st) {
        ar.write(fmt::format("piece{}_{}", k, name), t.detach().cpu(), /*is_buffer=*/true);
        names.push_back(name);
      }
    }
    pieces.push_back({{"segment", k}, {"begin", p.begin}, {"end", p.end}, {"state", names}});
  }
  ar.write("steps", steps_t_.cpu(), true);
  ar.write("lr_scale", at::full({}, lr_scale_, at::kDouble), true);
  ar.write("skip_factor", skip_factor_.cpu(), true);
  // Serialized in memory and written checked (train/io.h): the path overload of save_to ends the
  // process from a destructor when the disk fills up.
  train::write_file_checked(shard_pt(dir, rank), train::archive_bytes(ar));

  json meta = {{"format", kShardFormat},
               {"world_size", ctx_->world_size()},
               {"rank", rank},
               {"segments", segments_json(pieces_, segment_units())},
               {"pieces", pieces}};
  train::write_file_checked(shard_json(dir, rank), meta.dump(1) + "\n");
}

void DistributedOptimizer::load_shards(const std::string& dir) {
  // Layout of the checkpoint, from rank 0's shard; every shard must agree with it and with us.
  const json meta0 = read_json(shard_json(dir, 0));
  TORCH_CHECK(meta0.value("format", "") == kShardFormat, "checkpoint '", dir, "': ", shard_json(dir, 0),
              " is not an orthopt distributed optimizer shard (format ", kShardFormat, ")");
  const int old_world = meta0.at("world_size").get<int>();
  TORCH_CHECK(old_world >= 1, "checkpoint '", dir, "': bad world_size ", old_world);
  const json mine = segments_json(pieces_, segment_units());
  TORCH_CHECK(meta0.at("segments") == mine, "checkpoint '", dir,
              "': its parameter layout (groups, matrix banks, sizes) differs from this optimizer's.\n"
              "checkpoint: ", meta0.at("segments").dump(), "\nthis optimizer: ", mine.dump());

  // `index`: the piece's position in its shard's list, which names its tensors (piece<index>_<state>).
  struct OldPiece { int rank; size_t index; int64_t begin, end; std::vector<std::string> names; };
  std::vector<std::vector<OldPiece>> old_pieces(pieces_.size());
  for (int r = 0; r < old_world; ++r) {
    const json m = r == 0 ? meta0 : read_json(shard_json(dir, r));
    TORCH_CHECK(m.value("format", "") == kShardFormat && m.at("world_size").get<int>() == old_world &&
                    m.at("rank").get<int>() == r && m.at("segments") == meta0.at("segments"),
                "checkpoint '", dir, "': shard ", r, " does not belong to the same checkpoint as shard 0");
    const json& shard_pieces = m.at("pieces");
    for (size_t j = 0; j < shard_pieces.size(); ++j) {
      const json& p = shard_pieces[j];
      const size_t k = p.at("segment").get<size_t>();
      TORCH_CHECK(k < pieces_.size(), "checkpoint '", dir, "': shard ", r, " names segment ", k, " out of range");
      OldPiece op{r, j, p.at("begin").get<int64_t>(), p.at("end").get<int64_t>(),
                  p.at("state").get<std::vector<std::string>>()};
      if (op.end > op.begin) old_pieces[k].push_back(std::move(op));
    }
  }
  // By range: the block rotation gives rank r any block, and a shard may hold several pieces of
  // a segment (the Python engine writes one per owned matrix or scalar range).
  for (auto& ops : old_pieces)
    std::sort(ops.begin(), ops.end(), [](const OldPiece& a, const OldPiece& b) { return a.begin < b.begin; });

  // Read only the old shards that overlap what this rank owns.
  std::map<int, std::unique_ptr<torch::serialize::InputArchive>> archives;
  auto archive = [&](int r) -> torch::serialize::InputArchive& {
    auto& a = archives[r];
    if (!a) {
      a = std::make_unique<torch::serialize::InputArchive>();
      a->load_from(shard_pt(dir, r));
    }
    return *a;
  };

  std::vector<std::vector<Optimizer::StateDict>> states;
  if (local_) {
    states.resize(local_->param_groups().size());
    for (size_t g = 0; g < states.size(); ++g) states[g].resize(local_->param_groups()[g].params.size());
  }
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const auto& p = pieces_[k];
    if (p.local_index < 0) continue;
    std::vector<std::string> names;
    std::map<std::string, std::vector<at::Tensor>> parts;
    int64_t covered = p.begin;
    for (const auto& op : old_pieces[k]) {  // ascending by range
      const int64_t b = std::max(p.begin, op.begin), e = std::min(p.end, op.end);
      if (e <= b) continue;
      TORCH_CHECK(b == covered, "checkpoint '", dir, "': segment ", k, " has a gap at ", covered);
      covered = e;
      if (names.empty()) names = op.names;
      TORCH_CHECK(op.names == names, "checkpoint '", dir, "': segment ", k, " has different state names on shard ",
                  op.rank);
      for (const auto& name : names) {
        at::Tensor t;
        archive(op.rank).read(fmt::format("piece{}_{}", op.index, name), t, true);
        if (t.dim() == 0) {
          if (parts[name].empty()) parts[name].push_back(t);
        } else {
          TORCH_CHECK(t.size(0) == op.end - op.begin, "checkpoint '", dir, "': state '", name, "' of segment ", k,
                      " on shard ", op.rank, " has ", t.size(0), " rows, expected ", op.end - op.begin);
          parts[name].push_back(t.narrow(0, b - op.begin, e - b));
        }
      }
    }
    TORCH_CHECK(covered == p.end, "checkpoint '", dir, "': segment ", k, " covers up to ", covered, ", need ", p.end);
    auto& dict = states[local_group_of_[p.group]][p.local_index];
    for (auto& [name, ts] : parts) dict[name] = ts.size() == 1 ? ts[0].clone() : at::cat(ts, 0);
  }

  at::Tensor steps, lr_scale, skip;
  auto& a0 = archive(0);
  a0.read("steps", steps, true);
  a0.read("lr_scale", lr_scale, true);
  a0.read("skip_factor", skip, true);
  // Validates every name and shape before changing anything.
  if (local_) local_->load_param_states(states);
  steps_t_.copy_(steps.reshape({}));
  set_lr_scale(lr_scale.item<double>());
  set_skip_factor(skip.reshape({}));
}

void save_sharded_checkpoint(DistributedOptimizer& opt, const std::string& final_dir,
                             const std::function<void(const std::string& tmp_dir)>& extra, bool overwrite) {
  auto& ctx = opt.context();
  const std::string tmp = final_dir + ".tmp";
  // Every rank sees the same (shared or local) filesystem, so every rank refuses alike.
  TORCH_CHECK(overwrite || !fs::exists(final_dir), "checkpoint: '", final_dir,
              "' already exists (pass overwrite to replace it)");
  if (ctx.rank() == 0) {
    fs::remove_all(tmp);  // a stale temporary directory of an interrupted save
    fs::create_directories(tmp);
  }
  ctx.barrier();
  opt.save_shard(tmp);
  ctx.barrier();  // all shards are on disk
  if (ctx.rank() == 0) {
    if (extra) extra(tmp);
    const std::string parent = fs::path(final_dir).parent_path().empty() ? "." : fs::path(final_dir).parent_path().string();
    // Replacing: the previous checkpoint moves aside first and is deleted only once the new one is
    // published, so a crash at any point leaves a complete one (final_dir, or final_dir.old).
    const std::string old = final_dir + ".old";
    const bool replacing = fs::exists(final_dir);
    if (replacing) {
      fs::remove_all(old);
      fs::rename(final_dir, old);
    }
    fs::rename(tmp, final_dir);
    fsync_path(parent);
    if (replacing) fs::remove_all(old);
  }
  ctx.barrier();  // published: everyone may read it now
}

}  // namespace orthopt::dist
