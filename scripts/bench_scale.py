"""How each learner's training time and memory grow with the number of labels and of examples.

    python scripts/bench_scale.py [--models independent fixed_tree rta tree_crf] [--labels 16 32 ... 983]
                                  [--rows 1000 2000 5000 10000 21519] [--label-rows 2000] [--timeout 600]
                                  [--update]

Every cell is the user's command in its own process, ``python -m structtorch.train model=<m> data=mulan ...`` with
the learner's defaults and one bounded epoch: ``model.solver_iters=10`` L-BFGS iterations (Independent: 10 DCD
epochs; RTA: ``model.solver_iters=1``, one BCFW pass) and the certificate pass after it, structure learning included
(Chow-Liu, the trees, candidate graphs). Labels axis: the ``n`` most frequent labels of delicious
(``data.max_labels``, 983 labels in all) on ``--label-rows`` seeded training rows (``data.max_rows``); examples
axis: ``N`` seeded rows of tmc2007's training file (22 labels, 21,519 rows). Recorded: ``train_seconds`` of the run
and the process's peak resident memory.
Printed: each learner's growth exponent, the slope of log(time) against log(n) or log(N) fitted over the cells
that finished (1: linear; memory: of the peak above a process that only imports the command). Writes
scripts/results/bench_scale.json and bench_scale.png. Sizes that do not finish in ``--timeout`` seconds say so in
their row, and the larger sizes of that axis are not tried. ``--update`` reruns only the learners named and keeps
the other learners' rows and exponents of the existing JSON (every row has the date it was measured on; the meta
record's ``kept_rows`` names the learners whose rows were kept).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from benchutil import write_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from matrix import failure_line, run_logged, wait  # noqa: E402  (one process per cell, as the matrix table runs them)

RESULTS = Path(__file__).resolve().parent / "results"
AXES = {"labels": ("delicious", "data.max_labels"), "rows": ("tmc2007", "data.max_rows")}


def command(model: str, axis: str, size: int, label_rows: int, run_dir: Path) -> list[str]:
    """The training command of one cell: ``model`` with its defaults, one bounded epoch, at ``size``."""
    data, knob = AXES[axis]
    rows = [f"data.max_rows={label_rows}"] if axis == "labels" else []
    iters = 1 if model == "rta" else 10  # BCFW: one pass
    return [sys.executable, "-m", "structtorch.train", f"model={model}", "data=mulan", f"data.name={data}",
            f"{knob}={size}", *rows, "data.val_fraction=0", "trainer.max_epochs=1", f"model.solver_iters={iters}",
            "logger=none", "trainer.enable_progress_bar=false", f"hydra.run.dir={run_dir}"]


def run_cell(model: str, axis: str, size: int, label_rows: int, timeout: float, work: Path) -> dict:
    """One row: train seconds (the run's ``train_seconds``), wall seconds and peak MB, or why it has none."""
    run_dir = work / axis / f"{model}_{size}"
    run_dir.mkdir(parents=True, exist_ok=True)
    for old in ("metrics.json", "error.txt"):
        (run_dir / old).unlink(missing_ok=True)
    row = {"model": model, "axis": axis, "size": size}
    ended, wall = run_logged(command(model, axis, size, label_rows, run_dir), run_dir, work, timeout)
    if ended is None:
        return row | {"note": f"not finished in {timeout:.0f} s"}
    code, peak = ended
    if code != 0:
        return row | {"peak_mb": round(peak), "note": f"exit code {code}: {failure_line(run_dir)}"}
    metrics = json.loads((run_dir / "metrics.json").read_text())
    return row | {"train_s": round(metrics["train_seconds"], 2), "wall_s": round(wall, 1), "peak_mb": round(peak)}


def kept(previous: dict, rerun: list[str]) -> tuple[list[dict], dict]:
    """The rows and exponents of a previous run's JSON, less those of the learners in ``rerun``."""
    rows = [r for r in previous["rows"] if r["model"] not in rerun]
    exponents = {k: v for k, v in previous.get("exponents", {}).items() if k.split()[0] not in rerun}
    return rows, exponents


def baseline_mb(work: Path) -> float:
    """Peak resident MB of a process that only imports the training command (Python, torch, Lightning)."""
    proc = subprocess.Popen([sys.executable, "-c", "import structtorch.train"], cwd=str(work))
    return wait(proc, 120)[1]


def growth_exponent(rows: list[dict], key: str, offset: float = 0.0) -> float | None:
    """Least-squares slope of log(key - offset) against log(size) over the rows that have it (None below 2
    sizes)."""
    pts = [(math.log(r["size"]), math.log(r[key] - offset)) for r in rows if r.get(key, 0) > offset]
    if len(pts) < 2:
        return None
    mx, my = sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)
    return sum((a - mx) * (b - my) for a, b in pts) / sum((a - mx) ** 2 for a, _ in pts)


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, axis in zip(axes, AXES):
        for model in dict.fromkeys(r["model"] for r in rows):
            pts = [(r["size"], r["train_s"]) for r in rows if r["model"] == model and r["axis"] == axis
                   and r.get("train_s")]
            if pts:
                ax.loglog(*zip(*pts), "o-", label=model)
        ax.set_xlabel(f"{'labels (delicious)' if axis == 'labels' else 'training rows (tmc2007)'}")
        ax.set_ylabel("train seconds (one epoch)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["independent", "fixed_tree", "rta", "tree_crf"])
    ap.add_argument("--labels", nargs="*", type=int, default=[16, 32, 64, 128, 256, 512, 983])
    ap.add_argument("--rows", nargs="*", type=int, default=[1000, 2000, 5000, 10000, 21519])
    ap.add_argument("--label-rows", type=int, default=2000, help="training rows of the labels axis")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per cell")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "structtorch_bench_scale"))
    ap.add_argument("--out", default=str(RESULTS / "bench_scale.json"))
    ap.add_argument("--update", action="store_true", help="keep the other learners' results of --out")
    args = ap.parse_args()
    work, rows, exponents, previous = Path(args.work), [], {}, None
    if args.update and Path(args.out).exists():
        previous = json.loads(Path(args.out).read_text())
        rows, exponents = kept(previous, args.models)
    work.mkdir(parents=True, exist_ok=True)
    base, today = baseline_mb(work), datetime.date.today().isoformat()
    for model in args.models:
        for axis, sizes in (("labels", args.labels), ("rows", args.rows)):
            cells = []
            for size in sizes:
                cells.append(run_cell(model, axis, size, args.label_rows, args.timeout, work) | {"date": today})
                print(json.dumps(cells[-1]), flush=True)
                if "note" in cells[-1]:  # larger sizes will not finish either
                    break
            rows += cells
            exponents[f"{model} {axis}"] = {"train_s": growth_exponent(cells, "train_s"),
                                            "peak_mb": growth_exponent(cells, "peak_mb", base)}
    print(f"\n{'learner':<14}{'axis':<8}{'time exponent':>15}{'memory exponent':>17}   (memory above the "
          f"{base:.0f} MB of a process that imports the command)")
    for name, e in exponents.items():
        model, axis = name.split()
        fmt = [f"{v:.2f}" if v is not None else "-" for v in (e["train_s"], e["peak_mb"])]
        print(f"{model:<14}{axis:<8}{fmt[0]:>15}{fmt[1]:>17}")
    write_results(args.out, rows, torch.device("cpu"), sections={"exponents": exponents},
                  label_rows=args.label_rows, timeout=args.timeout, baseline_mb=round(base),
                  **({"kept_rows": sorted({r["model"] for r in rows} - set(args.models))} if previous else {}))
    plot(rows, Path(args.out).with_suffix(".png"))


if __name__ == "__main__":
    main()
