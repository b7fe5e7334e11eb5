"""CRANK Table 1 (Meshi et al., UAI 2013): CRANK, Full, Greedy, Project, MST and Empty on Mulan standard splits.

    python experiments/crank_table1.py [--datasets emotions] [--models crank full greedy project mst independent]
                                       [--l2 scene=0.3 emotions=cv-model yeast=cv] [--grid 0.01 0.03 0.1 0.3 1]
                                       [--max-labels medical=10] [--pairwise spin|indicator]
                                       [--out experiments/results/crank_table1] [--update] [--fused]

Each row is one run of the CLI code path (``structtorch.train.run`` on the composed Hydra config
``+experiment=crank_table1 model=<m> data=<d> model.l2=<l2>``), trained on the whole training file and scored once
on the test file. Every model scores label pairs by Ising couplings w_ij s_i s_j of the spins s = 2y - 1
(``model.spin=true``; ``--pairwise indicator``: w_ij y_i y_j). One l2 per dataset for every model, by default
chosen first in this call by 5-fold cross-validation on the training file (FixedTree, the grid ``L2_GRID`` as one
batched model, Hamming accuracy; the test file never chooses anything), or given as ``--l2 <dataset>=<value>``.
``--l2 <dataset>=cv-model`` chooses each model's own l2 by 5-fold CV on the training file
(``data.fold_pool=train``: every (l2, fold) of ``--grid`` (default ``L2_GRID``) one run of that model, trained on
four folds and scored by Hamming accuracy on the fifth; the curve goes into the row). ``--max-labels`` keeps a
dataset's most frequent labels (default: medical=10, the paper's Medical). Writes <out>.md / .csv with the paper's
rows beside ours, the learned trees, and Table 2 (train and test time relative to Full, for the datasets where Full
ran in the same call; "test s" is the prediction of the whole test file by each trained learner,
``learner(x_test)`` (energy plus inference, without the test loop's data loading and metrics), all of a dataset's
models loaded from their checkpoints and timed side by side at the end: one thread, interleaved, best of 7).
``--update`` keeps the committed rows of the (dataset, model) pairs not rerun. ``--fused`` trains with
``fused=true`` (the fused C++ CPU kernels: the same results up to rounding).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from runner import ROOT, choose_by_cv, run_config, run_folds
from tables import curve, markdown, merge_rows, percents, read_rows, write_table

from structtorch.data import Standardizer, load_mulan_splits
from structtorch.learners import LEARNERS

MODELS = {"crank": "CRANK", "full": "Full", "greedy": "Greedy", "project": "Project", "mst": "MST",
          "independent": "Empty"}
PAPER = {  # Table 1, Hamming / 0-1 / example F1 (%)
    "CRANK": {"scene": (90.5, 58.9, 64.8), "emotions": (79.2, 29.2, 60.5), "medical": (96.9, 74.0, 78.2),
              "yeast": (80.1, 17.6, 60.4)},
    "Full": {"scene": (90.7, 62.2, 67.8), "emotions": (79.0, 33.7, 62.5), "medical": (96.9, 75.0, 78.3),
             "yeast": (80.2, 19.0, 60.9)},
    "Greedy": {"scene": (90.2, 56.9, 62.6), "emotions": (78.5, 24.3, 54.5), "medical": (96.9, 74.0, 78.3),
               "yeast": "too slow"},
    "Project": {"scene": (89.5, 52.1, 59.2), "emotions": (77.6, 20.8, 49.8), "medical": (96.7, 72.7, 77.0),
                "yeast": (80.1, 16.4, 60.7)},
    "MST": {"scene": (89.9, 53.0, 59.6), "emotions": (79.1, 28.2, 57.5), "medical": (96.7, 71.9, 77.5),
            "yeast": (80.1, 16.1, 60.3)},
    "Empty": {"scene": (89.3, 49.5, 56.5), "emotions": (76.7, 20.3, 48.5), "medical": (96.4, 71.0, 76.1),
              "yeast": (79.8, 12.1, 58.0)},
}
PAPER_TABLE2 = {"CRANK": "1.82 / 0.02", "Full": "1.0 / 1.0", "Project": "0.17 / 0.06", "MST": "1.32 / 0.02",
                "Empty": "0.01 / 0.02"}  # Table 2 (yeast): time relative to Full
L2_GRID = [0.01, 0.03, 0.1, 0.3, 1.0]  # baselines_mulan's grid
MAX_LABELS = {"medical": 10}  # the paper's Medical: its 10 most frequent labels


def shared_overrides(data: str, max_labels: int | None, fused: bool, spin: bool) -> list[str]:
    """The overrides every run on a dataset shares (the CV runs and the cells): the data (the whole training split,
    no validation split), its label cap, the fused kernels on or off, the pairwise parametrisation."""
    return ([f"data={data}", "data.val_fraction=0", f"fused={str(fused).lower()}", f"model.spin={str(spin).lower()}"]
            + ([f"data.max_labels={max_labels}"] if max_labels else []))


def cell(model: str, dataset: list[str], l2: float) -> list[str]:
    """The overrides of one Table 1 cell (``dataset``: ``shared_overrides``)."""
    return ["+experiment=crank_table1", f"model={model}", *dataset, f"model.l2={l2}", "trainer.max_epochs=200"]


def l2_by_cv(dataset: list[str]) -> float:
    """FixedTree's 5-fold CV choice of l2 on the training file (``L2_GRID`` as one batched model), as in
    ``baselines_mulan.py``."""
    grid = ",".join(map(str, L2_GRID))
    m = run_config(["model=fixed_tree", *dataset, f"model.l2=[{grid}]", "model.cv_folds=5", "trainer.max_epochs=1000"])
    return float(m["cv"]["chosen_l2"])


def l2_by_model_cv(model: str, dataset: list[str], grid: list[float], folds: int = 5) -> tuple[float, str]:
    """The model's own l2 by ``folds``-fold CV on the training file (one run per l2 of ``grid`` and fold,
    Hamming accuracy on the held-out fold; the first best on ties): (l2, its CV curve "l2:acc ...")."""
    lam, cv = choose_by_cv(grid, lambda lam: [m["test/hamming_acc"] for m in run_folds(
        [*cell(model, dataset, lam), "data.fold_pool=train"], folds)])
    return lam, curve(grid, [100 * acc for acc in cv])


def time_predictions(runs: dict[str, Path], data: str, max_labels: int | None, repeats: int = 7
                     ) -> dict[str, float]:
    """Seconds to predict the whole (standardised) test file, ``learner(x_test)``, for every trained learner
    (loaded from its run's last checkpoint), side by side in this process: one thread, the models
    interleaved, best of ``repeats``. Key "full (LP solver)": Full predicting with the exact LP
    (``lp_map``, HiGHS), the paper's protocol (GLPK), best of 3."""
    d = load_mulan_splits(data, max_labels=max_labels, progress=False)
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


def row(model: str, data: str, l2: float, m: dict, paper_labels: bool = True) -> dict:
    """The table row of one run; the paper's numbers beside it when the run has the paper's label set."""
    name = MODELS[model]
    structure = m["structure"]
    paper = PAPER[name].get(data, "") if paper_labels else ""
    return {"dataset": data, "model": name, "l2": l2, **percents(m, "test/"),
            "paper H / 0-1 / F1": paper if isinstance(paper, str) else " / ".join(map(str, paper)),
            "edges": structure["num_edges"], "forest": structure["is_forest"],
            "converged": m["solver"].get("converged"), "train s": round(m["train_seconds"], 1),
            "tree": " ".join(f"{a}~{b}" for a, b, _ in structure["edges"]) if structure["is_forest"] else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["emotions"])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--l2", nargs="*", default=[],
                    help="dataset=value (or dataset=cv, dataset=cv-model) overrides of the l2")
    ap.add_argument("--grid", nargs="+", type=float, default=L2_GRID, help="the l2 grid of cv-model")
    ap.add_argument("--max-labels", nargs="*", default=[], help="dataset=L: keep its L most frequent labels")
    ap.add_argument("--out", default=str(ROOT / "experiments/results/crank_table1"))
    ap.add_argument("--update", action="store_true", help="keep the rows of <out>.csv that are not rerun")
    ap.add_argument("--fused", action="store_true", help="fused=true: the fused C++ CPU kernels")
    ap.add_argument("--pairwise", choices=["spin", "indicator"], default="spin",
                    help="pairwise scores w_ij s_i s_j on spins s = 2y - 1 (model.spin=true) or w_ij y_i y_j")
    args = ap.parse_args()
    out = Path(args.out)
    kept = read_rows(out.with_suffix(".csv")) if args.update else []
    l2 = dict(a.split("=") for a in args.l2)
    max_labels = {**MAX_LABELS, **{k: int(v) for k, v in (a.split("=") for a in args.max_labels)}}
    rows = []
    for data in args.datasets:
        L = max_labels.get(data)
        dataset = shared_overrides(data, L, args.fused, args.pairwise == "spin")
        with tempfile.TemporaryDirectory() as tmp:
            if str(l2.get(data, "cv")) == "cv":
                l2[data] = l2_by_cv(dataset)
                print(f"{data}: l2 = {l2[data]} (FixedTree's 5-fold CV on the training file)", flush=True)
            runs = {}
            for model in args.models:
                runs[model] = Path(tmp) / model
                if l2[data] == "cv-model":
                    lam, cv = l2_by_model_cv(model, dataset, args.grid)
                else:
                    lam, cv = float(l2[data]), ""
                metrics = run_config(cell(model, dataset, lam), runs[model])
                rows.append({**row(model, data, lam, metrics, paper_labels=L == MAX_LABELS.get(data)),
                             "l2 CV (Hamming %)": cv})
                print(rows[-1], flush=True)
                write(merge_rows(kept, rows, list(MODELS.values())), out)  # a long run keeps what it has measured
            seconds = time_predictions(runs, data, L)
        for r, model in zip(rows[-len(args.models):], args.models):
            r["test s"] = round(seconds[model], 4)
            if model == "full":
                r["LP test s"] = round(seconds["full (LP solver)"], 3)
        write(merge_rows(kept, rows, list(MODELS.values())), out)


def write(rows: list[dict], out: Path) -> None:
    columns = ["dataset", "model", "l2", "l2 CV (Hamming %)", "hamming_acc", "subset_acc", "example_f1",
               "paper H / 0-1 / F1", "edges", "converged", "train s", "test s"]
    rows = [{"test s": "", "l2 CV (Hamming %)": "", **r} for r in rows]
    trees = ["", "Learned trees (label pairs):", ""] + [f"- {r['dataset']} {r['model']}: {r['tree']}"
                                                        for r in rows if r["tree"]]
    write_table(rows, out, columns, trees + table2(rows))


def table2(rows: list[dict]) -> list[str]:
    """Table 2: each model's train and test time relative to Full's on the same dataset (same run); test
    time also relative to Full predicting with the exact LP solver (the paper's protocol)."""
    full = {r["dataset"]: r for r in rows if r["model"] == "Full" and r.get("LP test s")}
    cells = [[r["dataset"], r["model"], f"{r['train s'] / f['train s']:.2f}", f"{r['test s']:.4f}",
              f"{r['test s'] / f['test s']:.3f}", f"{r['test s'] / f['LP test s']:.4f}",
              PAPER_TABLE2.get(r["model"], "")]
             for r in rows if (f := full.get(r["dataset"])) is not None and r["test s"] != ""]
    if not cells:
        return []
    return ["", f"Table 2: time relative to Full in the same run (test = predicting the whole test file, one "
            f"thread, best of 7; Full predicts with the smoothed LP; its exact-LP time (lp_map, the paper's "
            f"protocol): {', '.join(str(f['LP test s']) + ' s on ' + d for d, f in full.items())}):", "",
            *markdown(["dataset", "model", "train / Full", "test s", "test / Full", "test / Full (LP solver)",
                       "paper yeast train / test"], cells)]


if __name__ == "__main__":
    main()
