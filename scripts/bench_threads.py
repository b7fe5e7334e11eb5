"""Training time with one torch thread vs torch's default thread count, side by side.

    python scripts/bench_threads.py [--epochs 60] [--repeats 3] [--models fixed_tree full]
                                    [--data emotions] [--root <mulan folder>]
                                    [--together 2] [--out scripts/results/bench_threads[_together].json]

Every run is a fresh ``python -m structtorch.train model=M data=D logger=none model.solver=adam
trainer.num_threads=N`` subprocess (N = 1, or null for torch's default; the minibatch gradient path,
a fixed number of epochs, so both sides do the same work), in its own temporary Hydra run directory; the
time is the run's ``train_seconds`` from its metrics.json (fit only: no interpreter start-up,
data loading or test). The runs of one model alternate 1 / default so that background load
hits both alike; the table shows the best (min) of --repeats, the spread (max / min) of each
side, and the ratio default / one thread (<= 1: more threads are not slower). The load average
before and after is recorded in the JSON as a noise indicator.

``--together J``: J identical runs started at the same moment, with torch's default threads each
(``trainer.num_threads=null``) against the CLI's default ``auto`` (``structtorch.threads``: the cores the other
processes leave, read again while training); the time of the slowest run of each round, ratio default / auto.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from benchutil import write_results

REPO = Path(__file__).resolve().parents[1]


def start(model: str, data: str, root: str | None, epochs: int, threads: int | str | None, out: str
          ) -> subprocess.Popen:
    """A fresh training subprocess with ``threads`` torch threads (None: torch's default; "auto": follow the load),
    its run directory ``out``; the data from ``root`` (None: the package's data cache, by name)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    cmd = [sys.executable, "-m", "structtorch.train", f"model={model}", f"data={data}",
           *([] if root is None else [f"data.root={root}"]), "logger=none", "model.solver=adam",
           f"trainer.max_epochs={epochs}", "trainer.enable_progress_bar=false",
           "trainer.enable_checkpointing=false", "test=false",
           f"trainer.num_threads={'null' if threads is None else threads}", f"hydra.run.dir={out}"]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, out: str) -> float:
    """train_seconds of a subprocess from ``start`` once it ends (fit only: no start-up, data loading or test)."""
    _, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"{' '.join(proc.args)} failed:\n{err[-3000:]}")
    return float(json.loads((Path(out) / "metrics.json").read_text())["train_seconds"])


def train_seconds(model: str, data: str, root: str | None, epochs: int, threads: int | str | None) -> float:
    """train_seconds of one fresh training subprocess (``start``)."""
    with tempfile.TemporaryDirectory() as out:
        return finish(start(model, data, root, epochs, threads, out), out)


def together_seconds(model: str, data: str, root: str | None, epochs: int, threads: int | str | None, jobs: int
                     ) -> list[float]:
    """train_seconds of ``jobs`` identical training subprocesses started at the same moment."""
    outs = [tempfile.mkdtemp() for _ in range(jobs)]
    procs = [start(model, data, root, epochs, threads, out) for out in outs]
    return [finish(proc, out) for proc, out in zip(procs, outs)]


def run_together(models: list[str], data: str, root: str | None, epochs: int, repeats: int, jobs: int) -> list[dict]:
    """``jobs`` runs started together, with torch's default threads each (``null``) and following the load
    (``auto``), alternating; the slowest run of each round (the sweep's wall time), best of ``repeats``."""
    rows = []
    for model in models:
        slowest: dict[str, list[float]] = {"auto": [], "null": []}
        for _ in range(repeats):
            for threads in ("null", "auto"):
                slowest[threads].append(max(together_seconds(model, data, root, epochs, threads, jobs)))
        auto, null = min(slowest["auto"]), min(slowest["null"])
        row = {"model": model, "data": data, "epochs": epochs, "jobs": jobs, "default_threads_s": null,
               "auto_threads_s": auto, "ratio": null / auto, "runs_default_threads_s": slowest["null"],
               "runs_auto_threads_s": slowest["auto"]}
        rows.append(row)
        print(f"{model:>12} {data:>9} {epochs:>4} x{jobs} | {null:8.2f} {auto:8.2f} | {row['ratio']:5.2f}", flush=True)
    return rows


def run(models: list[str], data: str, root: str | None, epochs: int, repeats: int) -> list[dict]:
    rows = []
    for model in models:
        times: dict[str, list[float]] = {"one": [], "default": []}
        for _ in range(repeats):
            times["one"].append(train_seconds(model, data, root, epochs, 1))
            times["default"].append(train_seconds(model, data, root, epochs, None))
        one, default = min(times["one"]), min(times["default"])
        row = {"model": model, "data": data, "epochs": epochs, "one_thread_s": one, "default_threads_s": default,
               "ratio": default / one, "runs_one_thread_s": times["one"], "runs_default_threads_s": times["default"],
               "spread_one": max(times["one"]) / one, "spread_default": max(times["default"]) / default}
        rows.append(row)
        print(f"{model:>12} {data:>9} {epochs:>4} | {one:8.2f} {default:8.2f} | {row['ratio']:5.2f}"
              f" | spread {row['spread_one']:4.2f} {row['spread_default']:4.2f}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", nargs="+", default=["fixed_tree", "full"])
    ap.add_argument("--data", default="emotions")
    ap.add_argument("--root", default=None, help="a local Mulan folder (default: the package's data cache)")
    ap.add_argument("--together", type=int, default=0,
                    help="start this many runs at once, torch's default threads each against num_threads=auto")
    ap.add_argument("--out", default=None, help="default: scripts/results/bench_threads[_together].json")
    args = ap.parse_args()
    args.out = args.out or f"scripts/results/bench_threads{'_together' if args.together else ''}.json"
    default_threads = torch.get_num_threads()
    print(f"torch={torch.__version__} default threads={default_threads} cpus={os.cpu_count()}"
          f" load={os.getloadavg()[0]:.2f}")
    load_before = os.getloadavg()
    if args.together:
        print(f"{args.together} runs started together; train s of the slowest: default threads each, "
              "num_threads=auto | default/auto")
        rows = run_together(args.models, args.data, args.root, args.epochs, args.repeats, args.together)
    else:
        print("       model      data epochs | train s: 1 thread  default | default/1 | spread (max/min)")
        rows = run(args.models, args.data, args.root, args.epochs, args.repeats)
    write_results(args.out, rows, torch.device("cpu"), default_threads=default_threads, repeats=args.repeats,
                  load_avg_before=load_before, load_avg_after=os.getloadavg(), together=args.together)


if __name__ == "__main__":
    main()
