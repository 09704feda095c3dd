# Sourced by the project's scripts. Python programs (python3 has no RPATH of the project's) load
# OpenBLAS's OpenMP build through LD_LIBRARY_PATH, whatever the system's BLAS alternative is
# (scripts/bootstrap.sh says why the OpenMP build; the executables carry it in DT_RPATH).
#   with_openmp_blas CMD...   runs CMD with that directory first in LD_LIBRARY_PATH
ORTHOPT_OPENMP_BLAS_DIR=$(ls -d /usr/lib/*/openblas-openmp 2>/dev/null | head -1 || true)
with_openmp_blas() {
  if [ -n "$ORTHOPT_OPENMP_BLAS_DIR" ]; then
    LD_LIBRARY_PATH="$ORTHOPT_OPENMP_BLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"
  else
    "$@"
  fi
}
