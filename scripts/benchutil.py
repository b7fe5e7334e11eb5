"""Shared helpers of the scripts/bench_*.py benchmarks: timing and the JSON record."""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch


def timeit(fn: Callable[[], object], device: torch.device, repeats: int, slow_after: float = 1.0,
           slow_repeats: int = 3) -> float:
    """Best (minimum) seconds over ``repeats`` calls after one warm-up call (schedule caches, allocator):
    on a shared machine, background load only ever adds time. A warm-up slower than ``slow_after``
    seconds caps the repeats at ``slow_repeats``."""
    t = time.perf_counter()
    fn()
    if time.perf_counter() - t > slow_after:
        repeats = min(repeats, slow_repeats)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return min(times)


def write_results(out: str | Path, rows: list[dict], device: torch.device, sections: dict | None = None,
                  **extra: object) -> None:
    """rows (plus any further named ``sections``) and the machine they were measured on, as JSON at ``out``;
    ``extra`` goes into the meta record."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"device": str(device), "torch": torch.__version__, "machine": platform.machine(),
            "processor": platform.processor(), "threads": torch.get_num_threads(), **extra}
    if device.type == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(device)
    out.write_text(json.dumps({"meta": meta, "rows": rows, **(sections or {})}, indent=1))
    print(f"wrote {out}")
