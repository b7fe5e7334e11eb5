"""glibc's malloc told to keep large blocks for reuse (the CLI's runs, ``train.run``).

glibc serves every block above its mmap threshold (32 MiB at most) with a fresh ``mmap`` and unmaps it on free, so
each large temporary tensor pays the kernel's page faults and page zeroing again: writing a new 134 MB tensor (one
chunk's [4266, 982, 2, 2] pairwise tables at delicious's shape) took 51 ms, 14-28 ms from reused heap memory.
``scripts/bench_allocator.py`` (FixedTree's objective at delicious's shape): an objective + gradient 1.28x and ten
L-BFGS steps 1.51x faster, peak memory 6% higher, since freed blocks stay resident for the next step (on
delicious's matrix rows 12-70% higher). ``reuse_large_blocks`` serves large blocks from the heap (``M_MMAP_MAX`` 0)
and keeps what is freed (``M_TRIM_THRESHOLD``), as ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=...`` would at
start-up; where either variable is set, the user's choice stands, and ``STRUCTTORCH_REUSE_MEMORY=0`` keeps glibc's
defaults (setting a ``MALLOC_`` variable to its default value does not: any of them turns off glibc's dynamic mmap
threshold, which alone lets blocks up to 32 MiB be reused).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import sys

__all__ = ["reuse_large_blocks"]

log = logging.getLogger("structtorch.allocator")
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # mallopt's parameters (malloc.h)
TRIM_THRESHOLD = 2**31 - 1  #: bytes free at the heap's top before glibc returns them (mallopt takes a C int)


@functools.cache
def reuse_large_blocks() -> bool:
    """Set glibc's mallopt so that large blocks come from, and return to, the heap (once per process); True where
    it is set, False on other C libraries, where ``MALLOC_MMAP_MAX_`` or ``MALLOC_TRIM_THRESHOLD_`` is in the
    environment, or with ``STRUCTTORCH_REUSE_MEMORY=0``."""
    if (not sys.platform.startswith("linux") or {"MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_"} & set(os.environ)
            or os.environ.get("STRUCTTORCH_REUSE_MEMORY") == "0"):
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return False
    ok = mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    log.debug("mallopt: large blocks %s", "reused from the heap" if ok else "left to glibc's defaults")
    return ok
