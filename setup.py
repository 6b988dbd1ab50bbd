"""`pip install .` builds libvitc and the vitc tool with the project's
Makefile and ships both inside the package, in vitc/_native/ (docs/python.md).

The metadata is in pyproject.toml; this file only holds what a declarative
file cannot: the version read from the Makefile, the make step, and a
platform tag for a wheel that carries machine code.
"""
import os
import re
import shutil
import subprocess

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py
from setuptools.errors import ExecError

ROOT = os.path.dirname(os.path.abspath(__file__))
# setuptools' default build/ is the Makefile's own output folder; a build of
# the package must neither clobber nor reuse a developer's `make` tree.
BUILD_BASE = "build-pip"


def makefile_var(name):
    with open(os.path.join(ROOT, "Makefile")) as f:
        m = re.search(r"^%s\s*:=\s*(\S+)" % name, f.read(), re.M)
    if not m:
        raise RuntimeError("Makefile: no %s := line" % name)
    return m.group(1)


def make_jobs():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def run_make(build_dir):
    # A parent make's jobserver (make test -> pip -> make) does not survive
    # pip's subprocesses, and its flags would override ours.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    cmd = [os.environ.get("MAKE", "make"), "-C", ROOT, "-j%d" % make_jobs(),
           "BUILD=" + build_dir, "all"]
    try:
        rc = subprocess.run(cmd, env=env).returncode
        why = "exit status %d" % rc
    except OSError as e:
        rc, why = None, e.strerror
    if rc != 0:
        raise ExecError(
            "`%s` failed (%s): building vitc needs make, a C11 compiler, pkg-config and "
            "jansson's headers, plus optionally OpenBLAS, libpng, libturbojpeg and zlib "
            "(sh scripts/install-deps.sh --system installs them on Debian/Ubuntu)"
            % (" ".join(cmd), why))


class BuildPy(build_py):
    """build_py, then the Makefile; its library and tool are copied into the
    package as vitc/_native/libvitc.so.<SOVERSION> and vitc/_native/vitc."""

    def run(self):
        super().run()
        if self.editable_mode:
            # An editable install imports python/vitc/, which finds the
            # checkout's build/ (vitc._lib), so that is where make builds.
            run_make(os.path.join(ROOT, "build"))
            return
        build_dir = os.path.abspath(os.path.join(self.get_finalized_command("build").build_base, "make"))
        run_make(build_dir)
        native = os.path.join(self.build_lib, "vitc", "_native")
        os.makedirs(native, exist_ok=True)
        for src, dst in self._native_files(build_dir, native):
            # The .so is a symlink chain (libvitc.so.0 -> libvitc.so.0.1.0) and
            # a wheel holds files only: copy what it points to.
            shutil.copyfile(os.path.realpath(src), dst)
            os.chmod(dst, 0o755)

    @staticmethod
    def _native_files(build_dir, native):
        soname = "libvitc.so." + makefile_var("SOVERSION")
        return [(os.path.join(build_dir, soname), os.path.join(native, soname)),
                (os.path.join(build_dir, "vitc"), os.path.join(native, "vitc"))]

    def get_outputs(self, include_bytecode=1):
        outs = super().get_outputs(include_bytecode)
        if self.editable_mode:
            return outs
        native = os.path.join(self.build_lib, "vitc", "_native")
        return outs + [dst for _, dst in self._native_files("", native)]


class NativeDistribution(Distribution):
    """Machine code inside, though no extension module: the wheel is a
    platform wheel and installs into platlib."""

    def has_ext_modules(self):
        return True


class BdistWheel(bdist_wheel):
    """The binding reaches the library and the tool through ctypes and exec,
    never the CPython ABI, so one wheel serves every Python 3 of a platform:
    py3-none-<platform>, not cp311-cp311-<platform>."""

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


# egg_info wants its folder to exist (a fresh clone has none).
os.makedirs(os.path.join(ROOT, BUILD_BASE), exist_ok=True)
setup(
    version=makefile_var("VERSION"),
    distclass=NativeDistribution,
    cmdclass={"build_py": BuildPy, "bdist_wheel": BdistWheel},
    # egg-info next to the build, not in python/ among the sources.
    options={"build": {"build_base": BUILD_BASE}, "egg_info": {"egg_base": BUILD_BASE}},
)
