#!/bin/sh
# Install, on Debian 12, the packages vitc's build and tests need and this
# machine lacks. Calls apt-get only when something is missing.
set -eu
# clang and its runtime: libFuzzer and the sanitizers for `make fuzz` (CI).
PKGS="build-essential pkg-config libjansson-dev libcmocka-dev libopenblas-dev \
libpng-dev libturbojpeg0-dev zlib1g-dev python3-numpy python3-torch python3-torchvision python3-pil \
clang libclang-rt-14-dev dataset-fashion-mnist libopenmpi-dev openmpi-bin"
missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-deps: missing packages:$missing (no apt-get here; install them by hand)" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "install-deps: missing packages:$missing; run as root or install them" >&2; exit 1
    fi
fi
echo "install-deps: installing$missing" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >&2
