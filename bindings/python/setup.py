"""pip install ./bindings/python

Runs SWIG on bindings/ember.i, compiles the extension ember._emberc against
libember.so and copies libember.so.1 (and the CUDA plugin when it was built)
into the package, so the installed package is self-contained (the extension
finds libember through RPATH $ORIGIN).

Where libember comes from, in this order:
  1. $EMBER_LIB_DIR (a directory with libember.so.*), when set;
  2. <repo>/build/capi, when it holds a built libember (bash tools/build.sh)
     and $EMBER_BUILD_LIBEMBER is not 1;
  3. otherwise it is built here: CMake (and Ninja when found) configure the
     source tree with tests, benchmarks, bindings, CUDA and oneDNN off
     (libember then needs only libgomp and the C/C++ runtimes) and build only
     the `ember` target into the build directory. XGrammar (structured output)
     is built in when its source is there (the sdist's copy, else
     tools/fetch_xgrammar.sh's). $EMBER_CMAKE_ARGS adds CMake arguments
     (e.g. "-DEMBER_WITH_ONEDNN=ON"); needs cmake, a C++20 compiler and
     nlohmann-json3-dev.

The source tree is $EMBER_SOURCE_DIR, else the repository around this
directory, else ember_src/ next to this file (the sdist that
tools/package_python.sh makes carries it there). Offline installs:
    python3 -m venv --system-site-packages .venv
    .venv/bin/pip install --no-build-isolation --no-index ./bindings/python
"""

import glob
import os
import re
import shlex
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def source_root():
    for d in (os.environ.get("EMBER_SOURCE_DIR"), os.path.dirname(os.path.dirname(HERE)),
              os.path.join(HERE, "ember_src")):
        if d and os.path.isfile(os.path.join(d, "include", "ember", "ember.h")):
            return d
    raise SystemExit("ember: Ember's source tree not found (set EMBER_SOURCE_DIR)")


ROOT = source_root()
INCLUDE = os.path.join(ROOT, "include")
INTERFACE = os.path.join(ROOT, "bindings", "ember.i")


def prebuilt_lib_dir():
    """The directory of an existing libember, or None when it must be built."""
    d = os.environ.get("EMBER_LIB_DIR")
    if d:
        if not glob.glob(os.path.join(d, "libember.so.*")):
            raise SystemExit(f"ember: EMBER_LIB_DIR={d} holds no libember.so.*")
        return d
    d = os.path.join(ROOT, "build", "capi")
    if os.environ.get("EMBER_BUILD_LIBEMBER") != "1" and glob.glob(os.path.join(d, "libember.so.*")):
        return d
    return None


def build_libember(build_dir):
    """Builds libember from ROOT with CMake into build_dir; returns the directory of libember.so."""
    cmake = shutil.which("cmake")
    if not cmake:
        raise SystemExit("ember: building libember needs CMake (Debian: apt-get install cmake build-essential "
                         "nlohmann-json3-dev), or set EMBER_LIB_DIR to a built libember")
    args = [cmake, "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release", "-DEMBER_BUILD_TESTS=OFF",
            "-DEMBER_BUILD_BENCH=OFF", "-DEMBER_BUILD_BINDINGS=OFF", "-DEMBER_WITH_CUDA=OFF",
            "-DEMBER_WITH_ONEDNN=OFF"]
    if shutil.which("ninja") and not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        args += ["-G", "Ninja"]
    xgrammar = glob.glob(os.path.join(ROOT, "deps", "xgrammar-*", "include", "xgrammar", "xgrammar.h"))
    if xgrammar:
        args.append("-DEMBER_XGRAMMAR_SOURCE=" + os.path.dirname(os.path.dirname(os.path.dirname(xgrammar[0]))))
    args += shlex.split(os.environ.get("EMBER_CMAKE_ARGS", ""))
    print("ember: building libember:", " ".join(args), flush=True)
    subprocess.check_call(args)
    jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
    subprocess.check_call([cmake, "--build", build_dir, "--target", "ember", "-j", jobs])
    return os.path.join(build_dir, "capi")


def version():
    with open(os.path.join(INCLUDE, "ember", "ember.h")) as f:
        h = f.read()
    return ".".join(re.search(rf"#define EMBER_VERSION_{p} (\d+)", h).group(1) for p in ("MAJOR", "MINOR", "PATCH"))


class BuildSwigExt(build_ext):
    """libember (found or built), SWIG into the build directory (the source tree gets no generated
    file), then compile."""

    def run(self):
        libs = prebuilt_lib_dir() or build_libember(os.path.abspath(os.path.join(self.build_temp, "libember")))
        gen = os.path.join(self.build_temp, "swig")
        os.makedirs(gen, exist_ok=True)
        wrap = os.path.join(gen, "ember_wrap.c")
        subprocess.check_call(["swig", "-python", "-threads", "-I" + INCLUDE, "-outdir", gen, "-o", wrap, INTERFACE])
        ext = self.extensions[0]
        ext.sources = [wrap]
        ext.library_dirs = [libs]
        super().run()
        pkg = os.path.join(self.build_lib, "ember")
        shutil.copy(os.path.join(gen, "emberc.py"), pkg)
        # libember under its SONAME (what _emberc asks for; found through RPATH $ORIGIN), and the
        # CUDA plugin when it was built (the engine looks for it next to libember).
        for lib in glob.glob(os.path.join(libs, "libember.so.[0-9]")) + \
                glob.glob(os.path.join(libs, "..", "gpu", "libember_cuda.so")):
            shutil.copy(lib, os.path.join(pkg, os.path.basename(lib)))  # follows the symlink


setup(
    name="ember",
    version=version(),
    description="Ember: embeddable LLM inference (Python binding)",
    packages=["ember"],
    ext_modules=[Extension("ember._emberc", sources=["ember/__init__.py"], include_dirs=[INCLUDE],
                           libraries=["ember"], runtime_library_dirs=["$ORIGIN"],
                           extra_compile_args=["-w"])],
    cmdclass={"build_ext": BuildSwigExt},
    python_requires=">=3.8",
    zip_safe=False,
)
