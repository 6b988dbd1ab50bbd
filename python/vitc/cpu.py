"""What vitc read about this CPU at run time, and the GEMM blocking it chose."""
import ctypes

from . import _lib

__all__ = ["cpu_info"]

# keys whose values are numbers (the others are text)
_INT_KEYS = {"family", "model", "stepping", "avx512", "amx", "l1d", "l2", "l3", "line", "kc", "mc",
             "nc", "lp_mc", "lp_nb"}


def cpu_info(text=False):
    """This CPU as vitc sees it, and the cache blocking chosen from it for
    the kernel path in use (vitc_cpu_info in vitc.h).

    Returns a dict: id (the name of its file in bench/results/, e.g.
    'amd-zen4-epyc-f25m17'), vendor, brand, family, model, stepping, uarch
    ('Zen 4', 'Sapphire Rapids', ... or 'unknown'), avx512 (0/1), datapath
    (AVX-512's: '256', '512', 'none' or 'unknown'), amx (0/1), l1d, l2, l3,
    line (bytes), cache_from ('cpuid', 'sysfs', 'defaults', 'VITC_CACHE'),
    arch (the kernel path), kc, mc, nc (the fp32 GEMM's blocks), lp_mc,
    lp_nb (the bf16 / int8 GEMM's), blocking_from. With text=True, the two
    lines `vitc --version` prints instead."""
    form = 0 if text else 1
    n = _lib.lib.vitc_cpu_info(None, 0, form)
    buf = ctypes.create_string_buffer(n + 1)
    _lib.lib.vitc_cpu_info(buf, n + 1, form)
    s = buf.value.decode("utf-8", "replace")
    if text:
        return s
    out = {}
    for line in s.splitlines():
        key, _, value = line.partition("=")
        out[key] = int(value) if key in _INT_KEYS else value
    return out
