"""Torch's intra-op thread count following the machine's load (the CLI's ``trainer.num_threads=auto``).

Jobs that share a machine (a sweep, DDP on CPU, a test suite, other users) must not oversubscribe its cores: on 2
cores at a load of 11, Independent on scene took 70-91 s with torch's default 2 threads and 9.5-17 s with 1. Inside
``follow_load()`` the run takes the cores the other processes leave free when it starts, and again about every
``RETUNE_S`` seconds while it trains (``progress.tick`` and the CLI's batches call ``retune``): jobs started at the
same moment may not see each other at their start, and a job that ends frees its cores for the others.

A reading is taken without sleeping, so that this process counts as running while it reads, and the readings of
each process are spread over 0.75-1.25 ``RETUNE_S``: two jobs started together that read at the same moment while
each slept between samples saw none of the other's threads (measured: both stayed on two threads).
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

__all__ = ["RETUNE_S", "follow_load", "free_cores", "other_runnable", "retune"]

RETUNE_S = 30.0  #: seconds between two readings of the load inside ``follow_load``, spread over 0.75-1.25 x
log = logging.getLogger("structtorch.threads")
_FOLLOW: dict = {"on": False, "limit": 1, "due": 0.0}
_JITTER = random.Random(os.getpid())  # spreads the readings of processes started together


def _own_running() -> int:
    """This process's threads that are runnable now (state R in /proc/self/task/*/stat)."""
    running = 0
    for stat in Path("/proc/self/task").glob("*/stat"):
        try:
            running += stat.read_text().rsplit(")", 1)[1].split()[0] == "R"
        except (OSError, IndexError):  # the thread ended while we read
            pass
    return running


def _machine_running() -> int:
    """The machine's runnable threads now (/proc/loadavg's fourth field: runnable / all)."""
    return int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])


def other_runnable(samples: int = 5) -> int:
    """The other processes' demand for cores now: the median over ``samples`` back-to-back readings of the runnable
    threads of the machine less this process's own, at least the reading one (the 1-minute load average where /proc
    has no such counts)."""
    try:
        readings = sorted(max(0, _machine_running() - max(1, _own_running())) for _ in range(samples))
        return readings[len(readings) // 2]
    except (OSError, IndexError, ValueError):
        return round(os.getloadavg()[0]) if hasattr(os, "getloadavg") else 0


def free_cores(other: int, limit: int) -> int:
    """Threads for this process when ``other`` runnable threads of other processes want the machine's cores: the
    cores they leave, at least 1 and at most ``limit``."""
    return max(1, min((os.cpu_count() or 1) - other, limit))


@contextmanager
def follow_load() -> Iterator[int]:
    """Inside the block torch's thread count follows the load (``retune``), at most torch's count at entry, which
    it has again after the block (the next run of a sweep in the same process starts from it); yields the count set
    at entry."""
    limit = torch.get_num_threads()
    other = other_runnable()
    threads = free_cores(other, limit)
    torch.set_num_threads(threads)
    log.info("trainer.num_threads=auto: %d torch thread%s (%d other runnable threads on %d cores; rechecked every "
             "%.0f s)", threads, "s" * (threads > 1), other, os.cpu_count() or 1, RETUNE_S)
    saved = dict(_FOLLOW)
    _FOLLOW.update(on=True, limit=limit, due=_next_reading(time.monotonic()))
    try:
        yield threads
    finally:
        _FOLLOW.update(saved)
        torch.set_num_threads(limit)


def _next_reading(now: float) -> float:
    """When the next reading is due: 0.75-1.25 ``RETUNE_S`` after ``now``."""
    return now + RETUNE_S * (0.75 + 0.5 * _JITTER.random())


def retune(now: float | None = None) -> None:
    """Inside ``follow_load``, once a reading is due (``_next_reading``): set torch's thread count to the cores the
    other processes leave free now, with a log line when it changes. Elsewhere nothing."""
    now = time.monotonic() if now is None else now
    if not _FOLLOW["on"] or now < _FOLLOW["due"]:
        return
    _FOLLOW["due"] = _next_reading(now)
    before, other = torch.get_num_threads(), other_runnable()
    threads = free_cores(other, _FOLLOW["limit"])
    if threads != before:
        torch.set_num_threads(threads)
        log.info("torch threads %d -> %d (%d other runnable threads on %d cores)", before, threads, other,
                 os.cpu_count() or 1)
