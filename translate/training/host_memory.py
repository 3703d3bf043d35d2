"""Host memory that is reused instead of handed back: the CPU's share of training speed.

glibc's malloc serves every block over 32 MB (a batch's logits over the vocabulary: tokens x
vocabulary x 4 bytes, 115 MB for a 4k-token batch over 8k pieces) with its own mmap, and unmaps
it on free; the next update's block then costs one page fault per 4 KB page, which the kernel
also zeroes. With mmap off and trimming off, freed blocks stay in the heap and the next update
reuses them (scripts/bench_fairseq.py measures the training loop with it). The price: the
process keeps its peak heap until it exits.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_MAX = -4
_KEEP_AT_TOP = 2**31 - 1  # bytes of free heap top kept (mallopt takes an int: its largest)
_applied = False


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed blocks for reuse (no mmap, no trimming), for the rest of
    this process. Returns whether it took effect (False away from glibc, where nothing changes)."""
    global _applied
    if _applied:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other C libraries without mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _applied = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, _KEEP_AT_TOP))
    if not _applied:
        log.debug("mallopt refused: host memory is handed back as usual")
    return _applied
