"""pip install ./bindings/python  (after building Ember: bash tools/build.sh)

Runs SWIG on bindings/ember.i, compiles the extension ember._emberc against
the built libember.so and copies libember.so.1 (and the CUDA plugin when it was
built) into the package, so the installed package is self-contained.

Where libember is: $EMBER_LIB_DIR, else <repo>/build/capi ($EMBER_SOURCE_DIR
names the repository when this directory was copied elsewhere). Offline installs:
    python3 -m venv --system-site-packages .venv
    .venv/bin/pip install --no-build-isolation --no-index ./bindings/python
"""

import glob
import os
import re
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("EMBER_SOURCE_DIR") or os.path.dirname(os.path.dirname(HERE))
INCLUDE = os.path.join(ROOT, "include")
INTERFACE = os.path.join(ROOT, "bindings", "ember.i")


def lib_dir():
    d = os.environ.get("EMBER_LIB_DIR") or os.path.join(ROOT, "build", "capi")
    if not glob.glob(os.path.join(d, "libember.so.*")):
        raise SystemExit(f"ember: libember.so not found in {d}: build Ember first (bash tools/build.sh) "
                         "or set EMBER_LIB_DIR")
    return d


def version():
    with open(os.path.join(INCLUDE, "ember", "ember.h")) as f:
        h = f.read()
    return ".".join(re.search(rf"#define EMBER_VERSION_{p} (\d+)", h).group(1) for p in ("MAJOR", "MINOR", "PATCH"))


class BuildSwigExt(build_ext):
    """SWIG into the build directory (the source tree gets no generated file), then compile."""

    def run(self):
        libs = lib_dir()
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
