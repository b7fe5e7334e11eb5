"""CRANK Table 1 (Meshi et al., UAI 2013): CRANK, Full, Greedy, Project, MST and Empty on Mulan standard splits.

    python experiments/crank_table1.py [--datasets emotions] [--models crank full greedy project mst independent]
                                       [--l2 scene=0.3 emotions=0.1 yeast=0.03] [--out experiments/results/crank_table1]
                                       [--update]

Each row is one run of the CLI code path (``structtorch.train.run`` on the composed Hydra config
``+experiment=crank_table1 model=<m> data=<d> model.l2=<l2>``), trained on the whole training file
and scored once on the test file. One l2 per dataset for every model: by default the value that
5-fold cross-validation on the training file chose for FixedTree in ``baselines_mulan.md`` (the test
file never chooses anything). Per-model CV of l2 is not run here (CRANK's restarts already use the
batch dimension). Writes <out>.md / .csv with the paper's rows beside ours, the learned trees, and
Table 2 (train and test time relative to Full, for the datasets where Full ran in the same call;
"test s" is the prediction of the whole test file by each trained learner, ``learner(x_test)``
(energy plus inference, without the test loop's data loading and metrics), all of a dataset's
models loaded from their checkpoints and timed side by side at the end: one thread, interleaved,
best of 7). ``--update`` keeps the committed rows of the (dataset, model) pairs not rerun.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from tables import merge_rows, read_rows, write_table

from structtorch.data import Standardizer, load_mulan_splits
from structtorch.learners import LEARNERS
from structtorch.train import run

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"crank": "CRANK", "full": "Full", "greedy": "Greedy", "project": "Project", "mst": "MST",
          "independent": "Empty"}
PAPER = {  # Table 1, Hamming / 0-1 / example F1 (%)
    "CRANK": {"scene": (90.5, 58.9, 64.8), "emotions": (79.2, 29.2, 60.5), "yeast": (80.1, 17.6, 60.4)},
    "Full": {"scene": (90.7, 62.2, 67.8), "emotions": (79.0, 33.7, 62.5), "yeast": (80.2, 19.0, 60.9)},
    "Greedy": {"scene": (90.2, 56.9, 62.6), "emotions": (78.5, 24.3, 54.5), "yeast": ()},
    "Project": {"scene": (89.5, 52.1, 59.2), "emotions": (77.6, 20.8, 49.8), "yeast": (80.1, 16.4, 60.7)},
    "MST": {"scene": (89.9, 53.0, 59.6), "emotions": (79.1, 28.2, 57.5), "yeast": (80.1, 16.1, 60.3)},
    "Empty": {"scene": (89.3, 49.5, 56.5), "emotions": (76.7, 20.3, 48.5), "yeast": (79.8, 12.1, 58.0)},
}
PAPER_TABLE2 = {"CRANK": "1.82 / 0.02", "Full": "1.0 / 1.0", "Project": "0.17 / 0.06", "MST": "1.32 / 0.02",
                "Empty": "0.01 / 0.02"}  # Table 2 (yeast): time relative to Full
L2_BY_CV = {"scene": 0.3, "emotions": 0.1, "yeast": 0.03}  # FixedTree's 5-fold CV choice (baselines_mulan.md)


def run_one(model: str, data: str, l2: float, out: Path) -> dict:
    """One Table 1 cell: the run's metrics (its checkpoints under ``out``)."""
    overrides = ["+experiment=crank_table1", f"model={model}", f"data={data}", f"model.l2={l2}",
                 "data.val_fraction=0", "logger=none", "trainer.max_epochs=200", "trainer.enable_progress_bar=false"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    return run(cfg, out)


def time_predictions(runs: dict[str, Path], data: str, repeats: int = 7) -> dict[str, float]:
    """Seconds to predict the whole (standardised) test file, ``learner(x_test)``, for every trained learner
    (loaded from its run's last checkpoint), side by side in this process: one thread, the models
    interleaved, best of ``repeats``. Key "full (LP solver)": Full predicting with the exact LP
    (``lp_map``, HiGHS), the paper's protocol (GLPK), best of 3."""
    d = load_mulan_splits(data, progress=False)
    x_test = Standardizer.fit(d.x_train).transform(d.x_test).float()
    learners = {m: LEARNERS[m].load_from_checkpoint(next(out.rglob("last.ckpt")), map_location="cpu").eval()
                for m, out in runs.items()}
    best = dict.fromkeys(learners, float("inf"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            for _ in range(repeats):
                for m, learner in learners.items():
                    best[m] = min(best[m], _timed(learner, x_test))
            if "full" in learners:
                learners["full"].hparams.test_inference = "lp_map"
                best["full (LP solver)"] = min(_timed(learners["full"], x_test) for _ in range(3))
    finally:
        torch.set_num_threads(threads)
    return best


def _timed(learner: torch.nn.Module, x: torch.Tensor) -> float:
    t0 = time.perf_counter()
    learner(x)
    return time.perf_counter() - t0


def row(model: str, data: str, l2: float, m: dict) -> dict:
    name = MODELS[model]
    structure = m["structure"]
    paper = PAPER[name].get(data, ())
    return {"dataset": data, "model": name, "l2": l2,
            **{k: round(100 * m[f"test/{k}"], 2) for k in ("hamming_acc", "subset_acc", "example_f1")},
            "paper H / 0-1 / F1": " / ".join(map(str, paper)) if paper else "too slow",
            "edges": structure["num_edges"], "forest": structure["is_forest"],
            "converged": m["solver"].get("converged"), "train s": round(m["train_seconds"], 1),
            "tree": " ".join(f"{a}~{b}" for a, b, _ in structure["edges"]) if structure["is_forest"] else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["emotions"])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--l2", nargs="*", default=[], help="dataset=value overrides of the per-dataset l2")
    ap.add_argument("--out", default=str(ROOT / "experiments/results/crank_table1"))
    ap.add_argument("--update", action="store_true", help="keep the rows of <out>.csv that are not rerun")
    args = ap.parse_args()
    out = Path(args.out)
    kept = read_rows(out.with_suffix(".csv")) if args.update else []
    l2 = {**L2_BY_CV, **{k: float(v) for k, v in (a.split("=") for a in args.l2)}}
    rows = []
    for data in args.datasets:
        with tempfile.TemporaryDirectory() as tmp:
            runs = {}
            for model in args.models:
                runs[model] = Path(tmp) / model
                rows.append(row(model, data, l2[data], run_one(model, data, l2[data], runs[model])))
                print(rows[-1], flush=True)
                write(merge_rows(kept, rows, list(MODELS.values())), out)  # a long run keeps what it has measured
            seconds = time_predictions(runs, data)
        for r, model in zip(rows[-len(args.models):], args.models):
            r["test s"] = round(seconds[model], 4)
            if model == "full":
                r["LP test s"] = round(seconds["full (LP solver)"], 3)
        write(merge_rows(kept, rows, list(MODELS.values())), out)


def write(rows: list[dict], out: Path) -> None:
    columns = ["dataset", "model", "l2", "hamming_acc", "subset_acc", "example_f1", "paper H / 0-1 / F1", "edges",
               "converged", "train s", "test s"]
    rows = [{"test s": "", **r} for r in rows]
    trees = ["", "Learned trees (label pairs):", ""] + [f"- {r['dataset']} {r['model']}: {r['tree']}"
                                                        for r in rows if r["tree"]]
    write_table(rows, out, columns, trees + table2(rows))


def table2(rows: list[dict]) -> list[str]:
    """Table 2: each model's train and test time relative to Full's on the same dataset (same run); test
    time also relative to Full predicting with the exact LP solver (the paper's protocol)."""
    full = {r["dataset"]: r for r in rows if r["model"] == "Full" and r.get("LP test s")}
    lines = [f"| {r['dataset']} | {r['model']} | {r['train s'] / f['train s']:.2f} | {r['test s']:.4f} | "
             f"{r['test s'] / f['test s']:.3f} | {r['test s'] / f['LP test s']:.4f} | "
             f"{PAPER_TABLE2.get(r['model'], '')} |"
             for r in rows if (f := full.get(r["dataset"])) is not None and r["test s"] != ""]
    if not lines:
        return []
    return ["", f"Table 2: time relative to Full in the same run (test = predicting the whole test file, one "
            f"thread, best of 7; Full predicts with the smoothed LP; its exact-LP time (lp_map, the paper's "
            f"protocol): {', '.join(str(f['LP test s']) + ' s on ' + d for d, f in full.items())}):", "",
            "| dataset | model | train / Full | test s | test / Full | test / Full (LP solver) | "
            "paper yeast train / test |", "|---|---|---|---|---|---|---|", *lines]


if __name__ == "__main__":
    main()
