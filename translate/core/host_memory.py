"""Host memory that is reused instead of handed back: the CPU's share of training speed.

glibc's malloc serves every large block (a batch's logits over the vocabulary: tokens x
vocabulary x 4 bytes) with its own mmap, and unmaps it on free; the next update's block then
costs one page fault per page, which the kernel also zeroes. With mmap off and trimming off,
freed blocks stay in the heap and the next update reuses them. The price: the process keeps its
peak heap until it exits.

oneDNN (torch's CPU bf16 products) compiles a kernel for each shape of product it meets and
keeps only the last 1,024, as does ideep. Batch shapes repeat from epoch to epoch, but one epoch
meets more products than that: evicted and compiled again every epoch, they cost time and
fragment the heap that is never trimmed. Kept (keep_compiled_products), memory stops growing
once the first epoch has met them all. The price: memory grows with the batch shapes of an
epoch (set ONEDNN_PRIMITIVE_CACHE_CAPACITY and LRU_CACHE_CAPACITY lower to bound it).
(scripts/bench_fairseq.py measures the training loop with both.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_MAX = -4
_KEEP_AT_TOP = 2**31 - 1  # bytes of free heap top kept (mallopt takes an int: its largest)
_applied = False

# What oneDNN's and ideep's caches of compiled products are enlarged to (their default is 1,024
# each): room for every product of a run whose batch shapes repeat, at about 1 MB each.
COMPILED_PRODUCTS = 8192
_CACHE_CAPACITIES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # oneDNN's, ideep's


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


def keep_compiled_products(capacity: int = COMPILED_PRODUCTS) -> None:
    """Have oneDNN and ideep keep up to `capacity` compiled products each, instead of 1,024, in
    this process and the ones it starts; a capacity the user set stays. Both read it when the
    process computes its first oneDNN product, so this must come before: later, it changes
    nothing."""
    for name in _CACHE_CAPACITIES:
        os.environ.setdefault(name, str(capacity))
