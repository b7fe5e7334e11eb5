"""Every learner with its defaults on every Mulan dataset at hand, beside scikit-learn's BR-LinearSVC and ECC.

    python experiments/matrix.py [--datasets scene emotions ...] [--models independent ...] [--peers ...]
                                 [--timeout 900] [--update] [--out experiments/results/matrix]

Each structtorch cell is one run of the command a user types, ``python -m structtorch.train model=<m>
data=<d>``, with nothing else set (standard train/test files, the learner's defaults), in its own process: test
Hamming / subset (0/1) / example-F1 accuracy (%), training seconds, the process's peak memory and the solver's
final relative duality gap ("certified" when it met model.tol, "NOT certified" when max_epochs stopped it first;
CRANK and Project, non-convex, have no gap: "stationary" when CCCP met its stopping rule; after a search on a row
subset, also the gap of their forest retrained on every row). Each peer
(``peers.py``) chooses C by 3-fold CV on the training file and is timed over the CV and the final fit. A cell
that fails or runs past ``--timeout`` seconds (``--timeout-large`` above 160 labels) says so instead of
numbers. Datasets default to those in the data cache (``$STRUCTTORCH_DATA/mulan``). Writes <out>.csv, <out>.md
and <out>_summary.md (subset / example F1 per learner and dataset, the README's table; ``--summary`` rewrites it
from <out>.csv alone); ``--update`` keeps the rows not rerun.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runner import ROOT
from tables import SCORES, markdown, merge_rows, read_rows, write_table

from structtorch.data import fetch_mulan, mulan_datasets, read_mulan_labels
from structtorch.data.download import mulan_files, uncached_mulan_files
from structtorch.strategies.certified import COULD_NOT_CERTIFY

MODELS = ["independent", "fixed_tree", "full", "crank", "greedy", "mst", "project", "rta", "mam", "tree_crf"]
PEERS = ["sklearn BR-LinearSVC", "sklearn ECC"]
COLUMNS = ["dataset", "model", "hamming_acc", "subset_acc", "example_f1", "train s", "peak MB", "gap", "note"]


def cached_datasets() -> list[str]:
    """The Mulan datasets whose files are all in the data cache, in the catalog's order."""
    def cached(data: str) -> bool:
        try:
            return not uncached_mulan_files(data)
        except ValueError:  # the collection has no data files for it
            return False
    return [d for d in mulan_datasets() if cached(d)]


def label_count(data: str) -> int:
    """The labels of ``data`` by its label XML (fetched into the cache where missing), without reading its rows
    here: each cell's process is forked from this one, and Linux counts the parent's resident memory at the fork in
    the child's peak (``wait``)."""
    return len(read_mulan_labels(fetch_mulan(data, progress=False) / mulan_files(data)["xml"].file))


# ---------------------------------------------------------------------- one cell, in its own process
def peer_cell(name: str, data: str, out: Path) -> None:
    """Run peer ``name`` on ``data`` in this process and write its result to ``out``."""
    from peers import run_peer

    out.write_text(json.dumps(run_peer(name, data)))


def command(kind: str, name: str, data: str, run_dir: Path) -> list[str]:
    """The command line of a cell: the user's training command, or this script's peer mode."""
    if kind == "peer":
        return [sys.executable, str(Path(__file__).resolve()), "--peer", name, data, str(run_dir / "peer.json")]
    return [sys.executable, "-m", "structtorch.train", f"model={name}", f"data={data}", f"hydra.run.dir={run_dir}",
            "trainer.enable_progress_bar=false"]


def wait(proc: subprocess.Popen, timeout: float) -> tuple[int, float] | None:
    """(exit status, peak resident MB) of ``proc`` once it ends, or None after killing it at ``timeout`` s."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_maxrss / 1024
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return None


def run_logged(cmd: list[str], run_dir: Path, cwd: Path, timeout: float) -> tuple[tuple[int, float] | None, float]:
    """Run ``cmd`` in its own session, its output in run_dir/console.txt: ((exit status, peak MB), or None when
    killed at ``timeout`` s; wall seconds)."""
    t0 = time.perf_counter()
    with open(run_dir / "console.txt", "w") as log:
        proc = subprocess.Popen(cmd, cwd=str(cwd), start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
        ended = wait(proc, timeout)
    return ended, time.perf_counter() - t0


def run_cell(kind: str, name: str, data: str, work: Path, timeout: float) -> dict:
    """The table row of one cell, run in a subprocess with a wall-clock limit."""
    run_dir = work / data / name.replace(" ", "_")
    run_dir.mkdir(parents=True, exist_ok=True)
    for old in ("peer.json", "metrics.json", "error.txt"):
        (run_dir / old).unlink(missing_ok=True)
    ended, wall = run_logged(command(kind, name, data, run_dir), run_dir, work, timeout)
    row = {"dataset": data, "model": name}
    if ended is None:
        return {**row, "note": f"not finished in {timeout:.0f} s"}
    code, peak = ended
    row["peak MB"] = round(peak)
    if code != 0:
        return {**row, "note": f"exit code {code}: {failure_line(run_dir)}"}
    if kind == "peer":
        result = json.loads((run_dir / "peer.json").read_text())
        return {**row, **{k: result[k] for k in SCORES}, "train s": round(result["train_seconds"], 1),
                "note": f"C {result['C']:g} by 3-fold CV{peer_sample(result)} ({result['cv']})"}
    return {**row, **structtorch_cells(json.loads((run_dir / "metrics.json").read_text())),
            "note": f"wall {wall:.0f} s"}


def peer_sample(result: dict) -> str:
    """' on k labels' where the peer's CV scored a sample of the labels."""
    k, n = result["cv_labels"], result["num_labels"]
    return f" on {k} of {n} labels" if k < n else ""


def failure_line(run_dir: Path) -> str:
    """The reason a cell failed: its error.txt (a structtorch user error), else the console's last line."""
    for name in ("error.txt", "console.txt"):
        lines = (run_dir / name).read_text().strip().splitlines() if (run_dir / name).is_file() else []
        if lines:
            return lines[-1][:200]
    return "no output"


def structtorch_cells(metrics: dict) -> dict:
    """Scores (%), training seconds and the certificate of a run's metrics.json."""
    solver = metrics.get("solver", {})
    gap, done = solver.get("relative_gap"), solver.get("converged")
    if solver.get("certificate"):  # none: it would not have fit the time budget, or could not certify
        why = ("the steps' searches certified no row" if COULD_NOT_CERTIFY in solver["certificate"]  # uncertifiable's
               else "past the time budget")
        certificate = f"NOT certified (no certificate: {why})"
    elif gap is None:  # CCCP (CRANK, Project): non-convex, no duality gap; its stopping rule
        certificate = "stationary (no gap)" if done else "NOT stationary"
        refit = solver.get("refit")  # searched on a row subset; its forest retrained on every row
        if refit:
            certificate += (f"; forest on all rows {refit['relative_gap']:.1e} "
                            f"{'certified' if refit['converged'] else 'NOT certified'}")
    else:
        worst = max(gap) if isinstance(gap, list) else gap
        met = all(done) if isinstance(done, list) else done
        certificate = f"{worst:.1e} " + ("certified" if met else "NOT certified")
    return {**{k: round(100 * metrics[f"test/{k}"], 2) for k in SCORES},
            "train s": round(metrics["train_seconds"], 1), "gap": certificate}


# ---------------------------------------------------------------------- the table
def summary(rows: list[dict]) -> list[str]:
    """Subset / example-F1 accuracy (%) of each model (a row) on each dataset (a column), as markdown lines; a
    cell that failed shows "-" (matrix.md's note says why), one not run "not run", one not certified a "*"."""
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    cells = {(r["dataset"], r["model"]): r for r in rows}

    def cell(row: dict | None) -> str:
        if row is None:
            return "not run"
        if row.get("subset_acc") in ("", None):
            return "-"
        star = "*" if "NOT certified" in str(row.get("gap", "")) else ""
        return f"{float(row['subset_acc']):.2f} / {float(row['example_f1']):.2f}{star}"

    models = [m for m in [*MODELS, *PEERS] if any((d, m) in cells for d in datasets)]
    return markdown(["model", *datasets], [[m, *(cell(cells.get((d, m))) for d in datasets)] for m in models]) + [
        "", "Subset / example F1 accuracy (%) on each dataset's test file (`matrix.md` has Hamming accuracy, times, "
        "memory and gaps, and why a failed cell failed). *: not certified (stopped by the time budget or max_epochs)."]


def write_summary(rows: list[dict], out: Path) -> None:
    """``summary(rows)`` into <out>_summary.md."""
    path = out.with_name(out.name + "_summary.md")
    path.write_text("\n".join(summary(rows)) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=None, help="default: every dataset in the data cache")
    ap.add_argument("--models", nargs="*", default=MODELS)
    ap.add_argument("--peers", nargs="*", default=PEERS)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per cell (datasets of <= 160 labels)")
    ap.add_argument("--timeout-large", type=float, default=1200.0, help="seconds per cell above 160 labels")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "structtorch_matrix"),
                    help="run directories of the cells")
    ap.add_argument("--update", action="store_true", help="keep the rows of <out>.csv that are not rerun")
    ap.add_argument("--out", default=str(ROOT / "experiments/results/matrix"))
    ap.add_argument("--summary", action="store_true", help="only rewrite <out>_summary.md from <out>.csv")
    ap.add_argument("--peer", nargs=3, metavar=("NAME", "DATA", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer:
        return peer_cell(args.peer[0], args.peer[1], Path(args.peer[2]))
    out, work = Path(args.out), Path(args.work)
    if args.summary:
        return write_summary(read_rows(out.with_suffix(".csv")), out)
    rows = read_rows(out.with_suffix(".csv")) if args.update else []
    for data in args.datasets or cached_datasets():
        timeout = args.timeout if label_count(data) <= 160 else args.timeout_large
        cells = [("structtorch", m) for m in args.models] + [("peer", p) for p in args.peers]
        for kind, name in cells:
            row = {k: "" for k in COLUMNS} | run_cell(kind, name, data, work, timeout)
            print(json.dumps(row), flush=True)
            rows = merge_rows(rows, [row], [*MODELS, *PEERS])
            write_table(rows, out, COLUMNS, footer=FOOTER)
            write_summary(rows, out)


FOOTER = ["", "Test accuracies in % (Hamming / subset 0-1 / example F1) on the standard train/test files; every "
          "structtorch row is `python -m structtorch.train model=<model> data=<dataset>` with its defaults; peers "
          "choose C by 3-fold CV on the training file (above 160 labels, CV on 20 labels drawn with seed 0; "
          "`experiments/peers.py`). train s: structtorch's fit "
          "(`train_seconds`), the peers' CV and final fit; peak MB: the process's peak resident memory; gap: the "
          "solver's final relative duality gap. Written by `python experiments/matrix.py` on the 2-core CPU "
          "machine."]


if __name__ == "__main__":
    main()
