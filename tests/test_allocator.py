"""allocator.reuse_large_blocks: freed large blocks stay in glibc's heap for the next tensor (in a subprocess, so
the test process keeps glibc's defaults)."""

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

from structtorch import allocator

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import ctypes, sys, torch
from structtorch.allocator import reuse_large_blocks
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                               "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
print(reuse_large_blocks() if sys.argv[1] == "on" else None)
block = torch.ones(64 << 20, dtype=torch.uint8)
del block
print(libc.mallinfo2().fordblks >= 64 << 20)  # the 64 MiB are free bytes of the heap, not unmapped
"""


def _probe(mode: str, **env: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                         env={**os.environ, **env})
    return out.stdout.split()


def _has_mallinfo2() -> bool:
    try:
        return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")
    except OSError:
        return False


@pytest.mark.skipif(not _has_mallinfo2(), reason="needs glibc >= 2.33 (mallinfo2)")
def test_freed_large_blocks_stay_in_the_heap():
    assert _probe("off") == ["None", "False"]  # glibc's default: a 64 MiB block is mapped and unmapped
    assert _probe("on") == ["True", "True"]


@pytest.mark.skipif(not _has_mallinfo2(), reason="needs glibc >= 2.33 (mallinfo2)")
def test_the_users_malloc_variables_stand():
    assert _probe("on", MALLOC_MMAP_MAX_="65536") == ["False", "False"]
    assert _probe("on", STRUCTTORCH_REUSE_MEMORY="0") == ["False", "False"]  # the opt-out, glibc's defaults


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux's")
def test_reuse_is_set_once_per_process(monkeypatch):
    calls = []

    class LibC:
        def mallopt(self, param: int, value: int) -> int:
            calls.append((param, value))
            return 1

    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda name: LibC())
    for name in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(name, raising=False)
    allocator.reuse_large_blocks.cache_clear()
    try:
        assert allocator.reuse_large_blocks() and allocator.reuse_large_blocks()
    finally:
        allocator.reuse_large_blocks.cache_clear()
    assert calls == [(-4, 0), (-1, allocator.TRIM_THRESHOLD)]  # M_MMAP_MAX 0, then the trim threshold, once


def test_a_run_reuses_large_blocks_only_after_its_data_are_loaded(monkeypatch, tmp_path):
    """The loader's temporaries (a dense float64 copy of the whole ARFF file and its splits: 5.7 GB at bookmarks'
    shape) are unmapped when freed, not kept in the heap for the whole fit (7.2 -> 5.1 GB peak there)."""
    from hydra import compose, initialize_config_dir

    from structtorch import train

    events = []
    build = train.build_learner

    def built(*args, **kwargs):  # the learner reads the data's sizes: they are loaded by then
        learner = build(*args, **kwargs)
        events.append("data")
        return learner

    monkeypatch.setattr(train, "build_learner", built)
    monkeypatch.setattr(train, "reuse_large_blocks", lambda: events.append("reuse"))
    overrides = ["model=independent", "data.num_train=60", "data.num_test=20", "data.num_labels=3", "logger=none",
                 "trainer.max_epochs=1", "trainer.enable_progress_bar=false", "trainer.enable_checkpointing=false"]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        train.run(compose("config", overrides=overrides), tmp_path)
    assert events == ["data", "reuse"]
