#!/bin/sh
# What vitc's build, tests and benchmark need, installed where missing:
#   1. Debian 12 packages (compiler, libraries, cmocka, clang for fuzzing,
#      the Fashion-MNIST data set): apt-get, only when one is missing;
#   2. the Python environment of the tests and the benchmark: a virtual
#      environment on Python 3.11 ($VITC_VENV, default .venv) with the
#      exact versions of requirements-dev.txt (torch, transformers, timm,
#      open_clip, ONNX Runtime, OpenVINO, ...). Reused as it is while
#      requirements-dev.txt is unchanged (a copy of it is kept in the venv).
#
#   sh scripts/install-deps.sh           both
#   sh scripts/install-deps.sh --system  the Debian packages only (C tests)
#   sh scripts/install-deps.sh --python  the virtual environment only
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
what=${1:-all}
case $what in all|--system|--python) ;; *)
    echo "install-deps: unknown argument '$what' (use --system, --python or nothing)" >&2; exit 2 ;;
esac

die() { echo "install-deps: $*" >&2; exit 1; }

apt_install() {  # packages to install if missing
    missing=""
    for p in "$@"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
            missing="$missing $p"
        fi
    done
    [ -z "$missing" ] && return 0
    command -v apt-get >/dev/null 2>&1 ||
        die "missing packages:$missing (no apt-get here; install them by hand)"
    SUDO=""
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null 2>&1 || die "missing packages:$missing; run as root or install them"
        SUDO="sudo"
    fi
    echo "install-deps: installing$missing" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >&2 ||
        die "apt-get could not install$missing"
}

if [ "$what" != --python ]; then
    # clang and its runtime: libFuzzer and the sanitizers for `make fuzz` (CI).
    # chromium and its driver: `vitc serve`'s page tested in a headless browser.
    apt_install build-essential pkg-config libjansson-dev libcmocka-dev libopenblas-dev \
        libpng-dev libturbojpeg0-dev zlib1g-dev libutf8proc-dev clang libclang-rt-14-dev \
        dataset-fashion-mnist libopenmpi-dev openmpi-bin libmicrohttpd-dev chromium chromium-driver
    # wrk: bench/serve_load.py's load generator, for that benchmark only:
    # without it everything else still installs.
    (apt_install wrk) || echo "install-deps: wrk not installed (bench/serve_load.py needs it)" >&2
fi
[ "$what" = --system ] && exit 0

REQ=$ROOT/requirements-dev.txt
VENV=${VITC_VENV:-$ROOT/.venv}
STAMP=$VENV/.vitc-requirements
if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && cmp -s "$REQ" "$STAMP"; then
    exit 0
fi

# Python 3.11: the wheels of torch and torchvision that lie on this machine's
# disk are built for it. $VITC_PYTHON overrides.
PY=${VITC_PYTHON:-}
if [ -z "$PY" ]; then
    for c in python3.11 python3; do
        if command -v "$c" >/dev/null 2>&1 &&
           [ "$("$c" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = 3.11 ]; then
            PY=$c; break
        fi
    done
fi
[ -n "$PY" ] || die "no Python 3.11 found (python3.11 or python3); set VITC_PYTHON to one"
if [ ! -x "$VENV/bin/python" ]; then
    if ! "$PY" -m venv "$VENV" 2>/dev/null; then
        rm -rf "$VENV"
        # Debian's own Python keeps venv's ensurepip in a package of its own.
        apt_install python3-venv python3.11-venv
        "$PY" -m venv "$VENV" || die "could not make a virtual environment in $VENV with $PY"
    fi
fi
# About 6.5 GB once installed (torch's CUDA build pulls ~3 GB of nvidia
# libraries): a full disk would stop pip half-way with "No space left".
need_kb=$((8 * 1024 * 1024))
free_kb=$(df -Pk "$VENV" 2>/dev/null | awk 'NR == 2 { print $4 }')
if [ -n "$free_kb" ] && [ "$free_kb" -lt "$need_kb" ]; then
    die "the Python environment needs about 8 GB free on the disk of $VENV, which has" \
        "$((free_kb / 1024)) MB: free some space (old build or temporary folders) or set" \
        "VITC_VENV to a folder on another disk, then rerun make deps. The C tests need none" \
        "of it: make test-c."
fi
echo "install-deps: installing requirements-dev.txt into $VENV (torch, transformers, timm," \
     "open_clip, ONNX Runtime, OpenVINO; several GB, a few minutes)" >&2
# torch 2.14.1 + torchvision 0.29.1 come from this machine's disk (pip's
# find-links / index configuration); nothing else is asked of the cap.
t0=$(date +%s)
# pip's log is kept in the venv and shown on failure, less the local
# mirror's "Location ... is ignored" lines, one per package.
if ! "$VENV/bin/pip" install --disable-pip-version-check --no-cache-dir -q -r "$REQ" > "$VENV/.pip.log" 2>&1; then
    grep -v "is ignored: it is neither a file nor a directory" "$VENV/.pip.log" >&2 || true
    die "pip could not install every package of requirements-dev.txt (its message is above: a" \
        "package or version missing from the index, or no network). The C tests need none of" \
        "them: make test-c. Fix the index or pin another version, then rerun make deps."
fi
"$VENV/bin/python" -c "import torch, torchvision, transformers, timm, open_clip, onnxruntime, openvino, nncf, skimage" ||
    die "the packages installed but do not import (above); remove $VENV and rerun make deps"
cp "$REQ" "$STAMP.tmp" && mv "$STAMP.tmp" "$STAMP"
echo "install-deps: $VENV ready in $(($(date +%s) - t0)) s" \
     "($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'))" >&2
