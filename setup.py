"""Builds the orthopt Python package with CMake against the torch that is already installed.

    pip install --no-build-isolation .        (docs/install.md; PyPI's torch would be another)
    pip wheel --no-build-isolation .

CMake builds the core library and the extension only (ORTHOPT_BUILD_TRAIN=OFF: no fmt,
nlohmann-json, CLI11, GoogleTest or OpenSSL needed); both land in the package directory and find
each other through RUNPATH $ORIGIN. The CUDA kernels are built when torch has CUDA and nvcc is
found (sm_90a unless CMAKE_CUDA_ARCHITECTURES is given). Environment:
    ORTHOPT_CMAKE_ARGS   extra CMake arguments (e.g. -DCMAKE_CUDA_ARCHITECTURES=90a)
    ORTHOPT_JOBS         parallel compile jobs (default: the number of cores)
    ORTHOPT_BUILD_TYPE   CMake build type (default Release)
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
BUILD_BASE = "build-pip"  # ./build is the CMake build directory of scripts/build.sh


def project_version():
    """The version of project(orthopt VERSION x.y.z) in CMakeLists.txt: the single source."""
    text = (ROOT / "CMakeLists.txt").read_text()
    m = re.search(r"project\(\s*orthopt\s+VERSION\s+([0-9]+\.[0-9]+\.[0-9]+)", text)
    if not m:
        raise RuntimeError("CMakeLists.txt: no project(orthopt VERSION x.y.z)")
    return m.group(1)


VERSION = project_version()


class BuildPy(build_py):
    """Writes orthopt/_version.py into the build, from python/_version.py.in."""

    def run(self):
        super().run()
        template = (ROOT / "python" / "_version.py.in").read_text()
        out = Path(self.build_lib) / "orthopt" / "_version.py"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(template.replace("@PROJECT_VERSION@", VERSION))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


def _which_nvcc():
    nvcc = shutil.which("nvcc")
    if nvcc:
        return nvcc
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    cand = Path(home) / "bin" / "nvcc"
    return str(cand) if cand.exists() else None


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        try:
            import torch
        except ImportError as e:  # the extension is built against the installed torch
            raise RuntimeError("orthopt needs torch installed first (and pip's --no-build-isolation)") from e
        cmake = shutil.which("cmake")
        if cmake is None:
            raise RuntimeError("orthopt needs cmake (Debian: apt-get install cmake)")

        build_dir = ROOT / BUILD_BASE / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        args = [
            f"-DCMAKE_BUILD_TYPE={os.environ.get('ORTHOPT_BUILD_TYPE', 'Release')}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            "-DORTHOPT_BUILD_TRAIN=OFF",
            "-DORTHOPT_BUILD_PYTHON=ON",
            "-DORTHOPT_PYTHON_PACKAGE=ON",
            "-DORTHOPT_INSTALL=OFF",
            "-DBUILD_TESTING=OFF",
        ]
        prefix = [torch.utils.cmake_prefix_path] if os.path.isdir(torch.utils.cmake_prefix_path) else []
        try:  # pip's pybind11 (Debian's is found by CMake itself)
            import pybind11

            args.append(f"-Dpybind11_DIR={pybind11.get_cmake_dir()}")
        except ImportError:
            pass
        if prefix:
            args.append("-DCMAKE_PREFIX_PATH=" + ";".join(prefix))
        # CUDA kernels only where torch can use them: on a CPU torch they would be dead weight.
        nvcc = _which_nvcc()
        if torch.version.cuda and nvcc:
            args += ["-DORTHOPT_CUDA_KERNELS=ON", f"-DCMAKE_CUDA_COMPILER={nvcc}"]
        else:
            args.append("-DORTHOPT_CUDA_KERNELS=OFF")
        if shutil.which("ninja"):
            args += ["-G", "Ninja"]
        args += shlex.split(os.environ.get("ORTHOPT_CMAKE_ARGS", ""))

        if (build_dir / "CMakeCache.txt").exists() and not (build_dir / "build.ninja").exists() \
                and not (build_dir / "Makefile").exists():
            (build_dir / "CMakeCache.txt").unlink()  # a configure that failed: start again
        subprocess.check_call([cmake, "-S", str(ROOT), "-B", str(build_dir)] + args)
        jobs = os.environ.get("ORTHOPT_JOBS") or str(os.cpu_count() or 1)
        subprocess.check_call([cmake, "--build", str(build_dir), "--target", "orthopt_python", "-j", jobs])

        # _C and liborthopt_core.so.<soversion> into the package directory (one file each, no
        # symlinks: wheels hold plain files).
        ext_path = Path(self.get_ext_fullpath(ext.name))
        ext_path.parent.mkdir(parents=True, exist_ok=True)
        files = (build_dir / "python_package_files.txt").read_text().split()
        c_module, core = Path(files[0]), Path(files[1])
        shutil.copyfile(c_module, ext_path)
        shutil.copyfile(core.resolve(), ext_path.parent / core.name)


(ROOT / BUILD_BASE).mkdir(exist_ok=True)
setup(
    name="orthopt",
    version=VERSION,
    description="Muon-family (orthogonal-update) optimizers on a C++ engine built on libtorch",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.9",
    packages=["orthopt"],
    package_dir={"": "python"},
    ext_modules=[CMakeExtension("orthopt._C")],
    cmdclass={"build_ext": CMakeBuild, "build_py": BuildPy},
    options={"build": {"build_base": BUILD_BASE}, "egg_info": {"egg_base": BUILD_BASE}},
    zip_safe=False,
)
