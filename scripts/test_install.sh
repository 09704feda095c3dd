#!/usr/bin/env bash
# Package checks (scripts/test.sh runs them after the test suites, against its build):
#   1. the BLAS: executables and Python load OpenBLAS's OpenMP build even where another BLAS
#      comes first in the library path;
#   2. pip: `pip install --no-build-isolation .` into a fresh venv, imported from another
#      directory (version, one Muon step against Newton–Schulz written plainly), `pip wheel`;
#   3. CMake: `cmake --install` of the build into a prefix, tests/consumer built against it with
#      find_package(orthopt) and run; tests/consumer configured with add_subdirectory.
# The pip build compiles the core library once more (core only, -j$(nproc), no kernels without a
# CUDA torch); its CMake directory build-pip/ makes a second run incremental.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
BUILD_DIR=$(cd "${ORTHOPT_BUILD_DIR:-build}" && pwd)
PY=${ORTHOPT_PYTHON:-/usr/bin/python3}
VERSION=$(sed -nE 's/^project\(orthopt VERSION ([0-9.]+).*/\1/p' CMakeLists.txt)
TMP=$(mktemp -d /tmp/orthopt-install.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
. scripts/blas_env.sh
step() { echo "== test_install: $*" >&2; }

# ---- 1. BLAS ----
# A decoy directory with another BLAS (pthreads or reference build) ahead in LD_LIBRARY_PATH,
# as a system whose alternatives point elsewhere would give.
blas_of() { sed -nE 's/^\s*libblas\.so\.3 => (\S+).*/\1/p'; }
other=$(ls -d /usr/lib/*/openblas-pthread /usr/lib/*/blas 2>/dev/null | head -1 || true)
if [ -n "$ORTHOPT_OPENMP_BLAS_DIR" ] && [ -n "$other" ] && [ -e "$other/libblas.so.3" ]; then
  step "BLAS: executables and Python load $ORTHOPT_OPENMP_BLAS_DIR ahead of $other"
  for exe in "$BUILD_DIR/orthopt" "$BUILD_DIR/tests/test_optim_muon"; do
    got=$(LD_LIBRARY_PATH="$other" ldd "$exe" | blas_of)
    [ "$got" = "$ORTHOPT_OPENMP_BLAS_DIR/libblas.so.3" ] || { echo "$exe loads libblas.so.3 from $got" >&2; exit 1; }
  done
  LD_LIBRARY_PATH="$other" with_openmp_blas "$PY" - "$ORTHOPT_OPENMP_BLAS_DIR" <<'PYEOF'
import sys, torch
torch.mm(torch.ones(64, 64), torch.ones(64, 64))
blas = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libblas.so" in l or "libopenblas" in l})
assert blas and all(p.startswith(sys.argv[1] + "/") for p in blas), blas
PYEOF
else
  step "BLAS: skipped (no OpenMP build or no other BLAS to compare with)"
fi

# ---- 2. pip ----
step "pip install --no-build-isolation . (venv with the system's site packages: Debian's torch)"
"$PY" -m venv --system-site-packages "$TMP/venv"
"$TMP/venv/bin/python" -m pip install -q --no-index --no-build-isolation "$SRC"
step "import from another directory"
(cd "$TMP" && with_openmp_blas "$TMP/venv/bin/python" - "$VERSION" "$TMP/venv" <<'PYEOF'
import os, sys
import torch
import orthopt
assert orthopt.__version__ == sys.argv[1], (orthopt.__version__, sys.argv[1])
assert os.path.realpath(orthopt.__file__).startswith(os.path.realpath(sys.argv[2])), orthopt.__file__
# One Muon step (first step: momentum = gradient; no decay, no lr scaling) against Jordan's
# Newton-Schulz written out in float64; fp32 NS of an 8x16 matrix is good to ~1e-6.
torch.manual_seed(0)
W = torch.randn(8, 16, requires_grad=True)
W0 = W.detach().clone()
G = torch.randn(8, 16)
W.grad = G.clone()
lr = 0.05
opt = orthopt.Muon([W], lr=lr, weight_decay=0.0, momentum_style="accumulate", nesterov=False,
                   lr_adjust="none", schedule="jordan", ns_steps=5, method="standard")
opt.step()
X = G.double() / (G.double().norm() + 1e-7)
for _ in range(5):
    A = X @ X.T
    X = 3.4445 * X + (-4.7750 * A + 2.0315 * A @ A) @ X
err = (W.detach().double() - (W0.double() - lr * X)).abs().max().item()
assert torch.isfinite(W).all() and (W.detach() - W0).abs().max() > 1e-3
assert err < 1e-4, err
print(f"orthopt {orthopt.__version__} from {os.path.dirname(orthopt.__file__)}: Muon step ok (max err {err:.2g})")
PYEOF
)
pkg=$("$TMP/venv/bin/python" -c 'import importlib.util as u, os; print(os.path.dirname(u.find_spec("orthopt").origin))')
ls "$pkg"/_C*.so "$pkg"/liborthopt_core.so.* >/dev/null
readelf -d "$pkg"/_C*.so | grep -q 'R.*PATH.*\$ORIGIN' || { echo "_C has no \$ORIGIN RUNPATH" >&2; exit 1; }
step "pip wheel --no-build-isolation . (reuses build-pip/)"
"$TMP/venv/bin/python" -m pip wheel -q --no-index --no-deps --no-build-isolation -w "$TMP/wheels" "$SRC"
"$PY" - "$TMP"/wheels/orthopt-"$VERSION"-*.whl <<'PYEOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for want in ("orthopt/__init__.py", "orthopt/_version.py", "orthopt/liborthopt_core.so."):
    assert any(n.startswith(want) for n in names), (want, names)
assert any(n.startswith("orthopt/_C") and n.endswith(".so") for n in names), names
print(sys.argv[1].rsplit("/", 1)[-1], "holds", len(names), "files")
PYEOF

# ---- 3. CMake package ----
step "cmake --install into a prefix; tests/consumer against it"
cmake --install "$BUILD_DIR" --prefix "$TMP/prefix" >/dev/null
lib=$(ls "$TMP"/prefix/lib*/liborthopt_core.so."$VERSION")
readelf -d "$lib" | grep -q "SONAME.*liborthopt_core.so.${VERSION%.*}\]" || { echo "$lib: SONAME" >&2; exit 1; }
! readelf -d "$lib" | grep -E 'NEEDED.*(libfmt|libcrypto|libssl)' || { echo "$lib needs fmt/OpenSSL" >&2; exit 1; }
"$TMP/prefix/bin/orthopt" --help >/dev/null
TORCH_PREFIX=$("$PY" -c 'import torch, os; p=torch.utils.cmake_prefix_path; print(p if os.path.isdir(p) else "")')
GEN=(); if command -v ninja >/dev/null; then GEN=(-G Ninja); fi
cmake -S tests/consumer -B "$TMP/consumer" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$TMP/prefix${TORCH_PREFIX:+;$TORCH_PREFIX}" >/dev/null
cmake --build "$TMP/consumer" >/dev/null
with_openmp_blas "$TMP/consumer/orthopt_consumer"
step "tests/consumer with add_subdirectory (configure only: the build would compile the core again)"
cmake -S tests/consumer -B "$TMP/consumer-sub" "${GEN[@]}" -DORTHOPT_SOURCE_DIR="$SRC" -DPython3_EXECUTABLE="$PY" \
  ${TORCH_PREFIX:+-DCMAKE_PREFIX_PATH="$TORCH_PREFIX"} >/dev/null
step "ok"
