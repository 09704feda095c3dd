#!/usr/bin/env bash
# The NCCL checks on one host with 2 GPUs (docs/distributed.md, "NCCL checks"). After the build
# (`bench/gpu/run_all.sh build`), from the repository root:
#     bench/gpu/run_nccl.sh
# About 2.5 minutes. Logs and JSON in $OUT (default build-gpu/out), a summary at the end (also
# $OUT/nccl_summary.txt). Every part runs under `timeout`; a failing part does not stop the next.
# Parts, most important first: (1) Python process_group= on NCCL (tests/gpu/test_dist_nccl.py),
# (2) C++ `orthopt dist-step` (Muon, Dion3) at N=2, (3) C++ trainer on 2 ranks, (4) dist-step at
# N=1, (5) trainer on 1 rank, (6) trainer resume check on 2 ranks, (7) `orthopt train --nproc 2
# --device cuda` as it is (see TRAIN_WRAP below). A part whose expected end is past the budget
# (NCCL_BUDGET_S, default 150 s; the last parts need ~200 s in all) is skipped and listed.
# Env: OUT, ORTHOPT_BUILD_DIR (build-gpu), PYTHON (python3), SET (llama1b), NCCL_BUDGET_S;
#      ORTHOPT_NCCL_DRY_RUN=1: the same plumbing on a CPU machine (Gloo, build/, set small, /usr/bin/python3).
set -uo pipefail
cd "$(dirname "$0")/../.."
# NVLink multicast must stay off on the test machines; every child inherits these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
DRY=${ORTHOPT_NCCL_DRY_RUN:-}
if [ -n "$DRY" ]; then
  BUILD=${ORTHOPT_BUILD_DIR:-build}; DEVICE=cpu; SET=${SET:-small}; PY=${PYTHON:-/usr/bin/python3}
  export ORTHOPT_NCCL_DRY_RUN=1 OMP_NUM_THREADS=1
  # A CPU trains the small preset at ~1 step/s: the trainer parts use the tiny one.
  TRAIN_MODEL=(--preset tiny --context 32 --batch-size 4); TRAIN_STEPS=${TRAIN_STEPS:-6}
  BUDGET=${NCCL_BUDGET_S:-600}
else
  BUILD=${ORTHOPT_BUILD_DIR:-build-gpu}; DEVICE=cuda; SET=${SET:-llama1b}; PY=${PYTHON:-python3}
  TRAIN_MODEL=(--preset small --batch-size 8); TRAIN_STEPS=${TRAIN_STEPS:-40}
  BUDGET=${NCCL_BUDGET_S:-150}
fi
BIN=$PWD/$BUILD/orthopt
OUT=${OUT:-$PWD/$BUILD/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SUMMARY=$OUT/nccl_summary.txt
RESULTS=$OUT/nccl_results.tsv   # part, rc, seconds, log
: > "$SUMMARY"; : > "$RESULTS"
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
note() { echo "$*" | tee -a "$SUMMARY"; }

# part NAME EXPECTED_S TIMEOUT_S LOG -- COMMAND...: runs COMMAND under timeout (SIGINT first, so
# pytest prints what it has; SIGKILL 10 s later), output to $OUT/LOG; skipped when the budget
# would be exceeded by the expected time.
part() {
  local name=$1 expect=$2 limit=$3 log=$4; shift 5
  if (( $(elapsed) + expect > BUDGET )); then
    printf '%s\tskipped\t0\t%s\n' "$name" "$log" >> "$RESULTS"
    echo "== $name: skipped (at $(elapsed) s, expected ${expect} s, budget ${BUDGET} s)"
    return
  fi
  echo "== $name (limit ${limit} s) -> $OUT/$log"
  local t=$(date +%s)
  timeout -s INT -k 10 "$limit" "$@" > "$OUT/$log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t ))
  [ $rc -eq 124 ] && echo "   timed out after ${limit} s"
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$dt" "$log" >> "$RESULTS"
  echo "   rc=$rc in ${dt} s"
}

note "NCCL checks: $(date -u '+%Y-%m-%d %H:%M UTC'), $(hostname), build $BUILD, device $DEVICE, set $SET${DRY:+ (DRY RUN: Gloo on CPU)}"
if command -v nvidia-smi >/dev/null; then
  { nvidia-smi -L; echo; nvidia-smi topo -m; } > "$OUT/nccl_topo.txt" 2>&1
  cat "$OUT/nccl_topo.txt"
fi
note "torch: $("$PY" -c 'import torch; d=torch.distributed; print(torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(), "nccl", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-", "nccl available", d.is_available() and d.is_nccl_available())' 2>&1 | tail -1)"
[ -x "$BIN" ] || note "!! $BIN not found: build first (bench/gpu/run_all.sh build)"

# ---- (1) Python: orthopt optimizers with process_group= on NCCL, 2 ranks vs 1 process; killed rank
part "python NCCL (pytest)" 50 150 nccl_pytest.log -- \
  env PYTHONPATH="$PWD/$BUILD/python" "$PY" -m pytest -q -rs -p no:cacheprovider tests/gpu/test_dist_nccl.py

# ---- C++ dist-step: JSON of rank 0 into $OUT/dist_step_<algorithm>_n<N>.json
dist_step() {  # N ALGORITHM EXPECTED_S
  part "dist-step $SET $2 N=$1" "$3" 60 "dist_step_$2_n$1.log" -- \
    env ORTHOPT_DIST_TIMEOUT_S=60 "$BIN" launch --nproc "$1" -- "$BIN" dist-step --set "$SET" --device "$DEVICE" \
    --algorithm "$2" --steps 5 --warmup 2 --json "$OUT/dist_step_$2_n$1.json"
}

# ---- C++ trainer. The trainer's `--device cuda` is the current device (cuda:0) on every rank
# (src/train/trainer.cpp pick_device has no LOCAL_RANK), so `train --nproc 2 --device cuda`
# would put both ranks on GPU 0; TRAIN_WRAP gives each rank launched by `orthopt launch` only its
# own GPU (CUDA_VISIBLE_DEVICES = its LOCAL_RANK-th), where cuda:0 is the right one.
TRAIN_WRAP=$OUT/nccl_rank_gpu.sh
cat > "$TRAIN_WRAP" <<'EOF'
#!/bin/sh
# One GPU per rank: the LOCAL_RANK-th visible device becomes this rank's only (cuda:0).
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  CUDA_VISIBLE_DEVICES=$(echo "$CUDA_VISIBLE_DEVICES" | cut -d, -f$(( ${LOCAL_RANK:-0} + 1 )))
else
  CUDA_VISIBLE_DEVICES=${LOCAL_RANK:-0}
fi
export CUDA_VISIBLE_DEVICES
exec "$@"
EOF
chmod +x "$TRAIN_WRAP"
# A deterministic corpus (no `bible` program needed): ~400 KB of pseudo-random words.
CORPUS=$OUT/nccl_corpus.txt
"$PY" - "$CORPUS" <<'EOF'
import random, sys
r = random.Random(12345)
words = "in the beginning was word and light shone upon waters of earth heaven day night".split()
text, n = [], 0
while n < 400000:
    text.append(r.choice(words) + (".\n" if r.random() < 0.12 else " "))
    n += len(text[-1])
open(sys.argv[1], "w").write("".join(text))
EOF
HALF=$(( TRAIN_STEPS / 2 ))
TRAIN_ARGS=(train "${TRAIN_MODEL[@]}" --steps "$TRAIN_STEPS" --eval-every "$HALF" --eval-batches 2
            --checkpoint-every "$HALF" --keep-last 3 --progress off --device "$DEVICE" --data "$CORPUS")
train_run() {  # NAME EXPECTED LIMIT RUN_DIR NPROC FRESH(1: remove RUN_DIR first) [extra args...]
  local name=$1 expect=$2 limit=$3 dir=$4 nproc=$5 fresh=$6; shift 6
  [ "$fresh" = 1 ] && rm -rf "${OUT:?}/$dir"
  if [ "$nproc" = 1 ]; then
    part "$name" "$expect" "$limit" "$dir.log" -- "$BIN" "${TRAIN_ARGS[@]}" --run-dir "$OUT/$dir" "$@"
  else
    part "$name" "$expect" "$limit" "$dir.log" -- env ORTHOPT_DIST_TIMEOUT_S=60 \
      "$BIN" launch --nproc "$nproc" -- "$TRAIN_WRAP" "$BIN" "${TRAIN_ARGS[@]}" --run-dir "$OUT/$dir" "$@"
  fi
}

dist_step 2 muon 15
dist_step 2 dion3 12
train_run "train N=2" 15 60 train_n2 2 1
dist_step 1 muon 12
dist_step 1 dion3 10
train_run "train N=1" 10 60 train_n1 1 1
train_run "train N=2 resume (1/2)" 12 60 train_n2r 2 1 --stop-after "$HALF"
train_run "train N=2 resume (2/2)" 12 60 train_n2r 2 0 --resume
# As it is (no TRAIN_WRAP): expected to fail at NCCL set-up, both ranks on cuda:0.
if [ -z "$DRY" ]; then
  rm -rf "$OUT/train_n2_plain"
  part "train --nproc 2 --device cuda (unwrapped; known issue)" 12 45 train_n2_plain.log -- \
    env ORTHOPT_DIST_TIMEOUT_S=20 "$BIN" "${TRAIN_ARGS[@]}" --nproc 2 --run-dir "$OUT/train_n2_plain"
fi

# ---- summary
echo
echo "================ NCCL summary"
"$PY" - "$OUT" "$RESULTS" "$HALF" <<'EOF' | tee -a "$SUMMARY"
import json, os, re, sys
out, results, half = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [l.rstrip("\n").split("\t") for l in open(results) if l.strip()]

def text(log):
    try:
        return open(os.path.join(out, log), errors="replace").read()
    except OSError:
        return ""

def mb(b):
    return f"{b / 1e9:.2f} GB" if b >= 1e9 else f"{b / 1e6:.2f} MB"

def metrics(run):
    steps, evals = {}, {}
    try:
        for line in open(os.path.join(out, run, "metrics.jsonl")):
            j = json.loads(line)
            if j.get("type") == "eval":
                evals[j["step"]] = j["val_loss"]
            elif "loss" in j:
                steps[j["step"]] = j
    except (OSError, ValueError, KeyError):
        pass
    return steps, evals

bad = [n for n, rc, _, _ in rows if rc not in ("0", "skipped") and not n.startswith("train --nproc 2 --device cuda (unwrapped")]
for name, rc, secs, log in rows:
    status = "skipped" if rc == "skipped" else "ok" if rc == "0" else "TIMEOUT" if rc == "124" else f"FAILED rc={rc}"
    if name.startswith("train --nproc 2 --device cuda (unwrapped"):
        status = ("passed (so the known issue is not one here)" if rc == "0" else
                  f"failed as expected (rc={rc})" if rc != "skipped" else status)
    print(f"{status:>16}  {secs:>4} s  {name}  [{log}]")
    t = text(log)
    if name.startswith("python"):
        tail = [l for l in t.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", l)]
        if rc == "0" and not (tail and "passed" in tail[-1]):
            bad.append(name + " (nothing passed: all skipped?)")
        for line in t.splitlines():
            if re.search(r"largest relative|kill test|state bytes|ranks \(torch|passed|failed|skipped|error|SKIPPED|FAILED", line):
                print("                  " + line.strip()[:400])
    elif name.startswith("dist-step"):
        j = log.replace(".log", ".json")
        try:
            d = json.load(open(os.path.join(out, j)))
        except (OSError, ValueError):
            if rc not in ("0", "skipped"):
                print("                  " + " | ".join(t.strip().splitlines()[-3:])[:600])
            continue
        ps = d.get("per_step", {})
        comm = ", ".join(f"{k} {v['calls']}x {mb(v['payload_bytes'])} payload / {mb(v['wire_bytes'])} wire"
                         for k, v in sorted(ps.items()))
        pad = 100.0 * (d["world_size"] * d["flat_elements_per_rank"] / d["params"] - 1)
        print(f"                  {d['backend']} N={d['world_size']} params {d['params'] / 1e6:.1f} M (padding "
              f"{pad:.1f}%): step {d['step_ms_median']:.1f} ms (reduce {d['reduce_gradients_ms_median']:.1f}, apply "
              f"{d['apply_update_ms_median']:.1f}); RS alone {d['reduce_scatter_alone_ms_median']:.2f} ms, AG alone "
              f"{d['all_gather_alone_ms_median']:.2f} ms; state/rank " + ", ".join(map(mb, d["state_bytes_per_rank"])))
        print(f"                  per step: {comm}")
    elif name.startswith("train") and "(1/2)" not in name:
        run = log[:-4]
        steps, evals = metrics(run)
        if steps:
            last = max(steps)
            tps = steps[last].get("tokens_per_s", 0)
            print(f"                  {len(steps)} steps, final loss {steps[last]['loss']:.5f}, val "
                  + ", ".join(f"{k}: {v:.5f}" for k, v in sorted(evals.items())) + f"; {tps:,.0f} tokens/s")
        elif rc not in ("0", "skipped"):
            print("                  " + " | ".join(t.strip().splitlines()[-3:])[:600])

rcs = {n: rc for n, rc, _, _ in rows}
# Resume check: the 2-rank run stopped after step `half` and resumed must equal the uninterrupted one.
a, ea = metrics("train_n2")
b, eb = metrics("train_n2r")
if rcs.get("train N=2") == "0" and rcs.get("train N=2 resume (2/2)") == "0":
    common = sorted(set(a) & set(b))
    keys = ("loss", "grad_norm")
    diffs = [abs(a[s][k] - b[s][k]) / max(abs(a[s][k]), 1e-30) for s in common for k in keys]
    vd = [abs(ea[s] - eb[s]) / abs(ea[s]) for s in sorted(set(ea) & set(eb))]
    worst = max(diffs + vd, default=float("nan"))
    full = len(common) == len(a) and len(a) > half
    verdict = ("bit-identical" if full and worst == 0.0 else "within 1e-4" if full and worst <= 1e-4 else "DIFFERENT")
    print(f"resume check (2 ranks, stopped after step {half} and resumed, vs uninterrupted): {len(common)}/{len(a)} "
          f"steps, largest relative difference of loss, grad norm, val loss {worst:.3g}: {verdict}")
    if verdict == "DIFFERENT":
        bad.append("resume check")
a1, e1 = metrics("train_n1")
if a and a1:
    print(f"train N=1 vs N=2 (global batch 1x vs 2x --batch-size, other samples: not equal): final loss "
          f"{a1[max(a1)]['loss']:.4f} vs {a[max(a)]['loss']:.4f}; first {a1[min(a1)]['loss']:.4f} vs "
          f"{a[min(a)]['loss']:.4f}")
skipped = [n for n, rc, _, _ in rows if rc == "skipped"]
print("NCCL checks: " + ("all passed" if not bad else "FAILED: " + "; ".join(bad))
      + (f" (skipped for time: {'; '.join(skipped)})" if skipped else ""))
EOF
note "total $(elapsed) s; logs in $OUT"
