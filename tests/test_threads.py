"""The thread count that follows the machine's load (``structtorch.threads``, the CLI's trainer.num_threads=auto)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time

import pytest
import torch

from structtorch import progress, threads


@pytest.fixture
def torch_threads():
    """Restore torch's thread count after the test."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_other_runnable_counts_other_processes():
    cores = os.cpu_count() or 1
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        time.sleep(1.0)
        assert threads.other_runnable() >= cores - 1
    finally:
        for p in spinners:
            p.kill()


@pytest.mark.parametrize("machine, own, other", [(5, 3, 2), (1, 3, 0), (4, 0, 3)])
def test_other_runnable_is_the_machines_runnable_threads_less_this_processes(monkeypatch, machine, own, other):
    """The reading thread is runnable and this process's own, so it is subtracted even where no own thread showed."""
    monkeypatch.setattr(threads, "_machine_running", lambda: machine)
    monkeypatch.setattr(threads, "_own_running", lambda: own)
    assert threads.other_runnable(samples=3) == other


def test_this_processes_own_running_threads_are_not_other_demand(torch_threads):
    """Threads of this process that compute (torch releases the GIL) are runnable and are this process's own: they
    are subtracted from the machine's runnable count."""
    torch.set_num_threads(1)
    stop = threading.Event()

    def spin():
        a = torch.randn(200, 200)
        while not stop.is_set():
            a @ a

    workers = [threading.Thread(target=spin) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        time.sleep(0.3)
        assert max(threads._own_running() for _ in range(20)) >= 2
    finally:
        stop.set()
        for w in workers:
            w.join()


def test_follow_load_sets_the_free_cores_and_retune_follows_the_load(monkeypatch, torch_threads, caplog):
    load = {"other": 0}
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(threads, "other_runnable", lambda: load["other"])
    torch.set_num_threads(3)  # the limit: torch's count at entry
    with caplog.at_level(logging.INFO, logger="structtorch.threads"):
        with threads.follow_load() as first:
            assert first == 3 == torch.get_num_threads()  # 4 cores free, at most the limit
            start, due = time.monotonic(), threads._FOLLOW["due"]
            assert start + 0.7 * threads.RETUNE_S < due <= start + 1.25 * threads.RETUNE_S  # spread readings
            load["other"] = 3
            threads.retune(start + threads.RETUNE_S / 2)  # too soon: unchanged
            assert torch.get_num_threads() == 3
            threads.retune(due)
            assert torch.get_num_threads() == 1
            assert "torch threads 3 -> 1 (3 other runnable threads on 4 cores)" in caplog.text
            load["other"] = 8  # more demand than cores: still one thread
            threads.retune(due + 2 * threads.RETUNE_S)
            assert torch.get_num_threads() == 1
            load["other"] = 0  # the others ended: back up to the limit, not beyond
            threads.retune(due + 4 * threads.RETUNE_S)
            assert torch.get_num_threads() == 3
            load["other"] = 3
            threads.retune(due + 6 * threads.RETUNE_S)
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 3  # the count from before the block
        threads.retune(time.monotonic() + 10 * threads.RETUNE_S)  # outside follow_load: nothing
        assert torch.get_num_threads() == 3


def test_progress_ticks_retune_inside_follow_load(monkeypatch, torch_threads):
    load = {"other": 0}
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(threads, "other_runnable", lambda: load["other"])
    monkeypatch.setattr(threads, "RETUNE_S", 0.0)
    torch.set_num_threads(2)
    with threads.follow_load():
        assert torch.get_num_threads() == 2
        load["other"] = 2
        with progress.phase("work", quiet=True):
            assert progress.tick(1, 10)
        assert torch.get_num_threads() == 1
        load["other"] = 0
        assert progress.tick(2)  # also outside a phase
        assert torch.get_num_threads() == 2
