"""RTA (Marchand et al., NIPS 2014) Table 1 and Figure 1 on Mulan datasets, beside the paper's numbers.

    python experiments/rta_table1.py [--datasets emotions scene yeast] [--models rta svm mam] [--folds 5]
                                     [--trees 10] [--k 8] [--set model.l2=1e-4 ...] [--paper-c] [--figure1] [--update]

Table 1 protocol (paper Sec. 5): k-fold cross-validation over the whole dataset (train and test files
together, ``data.num_folds``/``data.fold``); microlabel loss (100 - Hamming accuracy) and 0/1 loss
(100 - subset accuracy), mean and standard deviation over the folds. Every cell is one run of the CLI
code path (``structtorch.train.run``):

- ``rta``: ``model=rta model.margin=zero_one model.interaction_l2=1`` (Def. 6, the paper's joint features; BCFW
  to a 1e-3 duality gap or ``--max-epochs``; lambda = ``model.l2=1e-4`` on unit-norm features (``--set`` overrides
  it), not tuned on any test fold), with the fraction of test examples whose inference Lemma 7 certified;
  ``rta_hamming``: the same with the Hamming-rescaled margin (``model=rta``'s default);
- ``svm``: the paper's SVM = ``model=independent`` (one linear SVM per label), l2 chosen by 5-fold CV
  inside each training fold (the grid is one batched, certified model);
- ``mam``: ``model=mam``, the same number of random trees trained separately, max-marginals averaged, at
  one l2 (``--mam-l2``, default auto: ``MAM.auto_l2`` / N; a grid of T-tree models per fold is 10x the SVM's
  cost).

``--figure1``: the percentage of test examples (fold 0) whose K-best inference is certified exact (Lemma 7)
against K, as a percentage of the number of labels, for RTA with 5, 10 and 40 trees (paper Fig. 1),
written to ``<out>_figure1.{csv,md,png}``.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import torch
from runner import ROOT, compose_config, run_config, run_folds
from tables import mean_sd, merge_rows, read_rows, write_table

from structtorch.learners import RTA
from structtorch.train import build_datamodule

#: paper Table 1 (5-fold CV, %): microlabel loss and 0/1 loss of SVM, MAM, RTA, and the best other method
PAPER = {
    "emotions": {"svm": (22.4, 77.8), "mam": (19.5, 69.6), "rta": (18.8, 66.3), "best other": "MAM 19.5 / MAM 69.6"},
    "yeast": {"svm": (20.0, 85.9), "mam": (20.1, 86.0), "rta": (19.8, 77.7), "best other": "SVM 20.0 / SVM 85.9"},
    "scene": {"svm": (9.8, 47.2), "mam": (17.0, 94.6), "rta": (8.8, 30.2), "best other": "SVM 9.8 / SVM 47.2"},
    "enron": {"svm": (6.4, 99.6), "mam": (5.0, 87.9), "rta": (5.3, 87.7), "best other": "MAM 5.0 / MAM 87.9"},
    "medical": {"svm": (2.6, 91.8), "mam": (2.1, 63.1), "rta": (2.1, 58.8), "best other": "MAM 2.1 / MAM 63.1"},
}
MODELS = {"rta": "rta", "rta_hamming": "rta", "svm": "independent", "mam": "mam"}
SVM_GRID = "[0.001,0.01,0.1,1]"
#: ``--paper-c``: the paper's margin slack parameters C (Sec. 5), as lambda = 1 / (C N) on N training rows
PAPER_C = (100, 50, 10, 1, 0.5, 0.1, 0.01)
FIGURE_TREES = (5, 10, 40)
FIGURE_K = (2, 4, 8, 16, 32, 40, 60)  # the paper's K values


def cell_overrides(model: str, data: str, args: argparse.Namespace) -> list[str]:
    """The Hydra overrides of one model's runs on ``data`` (without the fold)."""
    o = [f"model={MODELS[model]}", f"data={data}", "data.val_fraction=0", f"trainer.max_epochs={args.max_epochs}"]
    if model in ("rta", "rta_hamming", "mam"):
        o += [f"model.num_trees={args.trees}"]
    if model in ("rta", "rta_hamming"):
        o += [f"model.k={args.k}", f"model.margin={'hamming' if model == 'rta_hamming' else 'zero_one'}",
              "model.interaction_l2=1",  # the paper's joint features
              *(paper_c_grid(data, args.folds) if args.paper_c else ["model.l2=1e-4"]), *args.set]
    if model == "svm":
        o += [f"model.l2={SVM_GRID}"]
    if model == "mam":
        o += [f"model.l2={args.mam_l2}"]
    return o


def paper_c_grid(data: str, folds: int) -> list[str]:
    """The overrides that choose RTA's lambda among the paper's ``PAPER_C`` (lambda = 1 / (C N), N the training rows
    of a fold of ``data``) by a 3-fold CV inside each training fold, on held-out subset accuracy (the 0/1 loss)."""
    dm = build_datamodule(compose_config([f"data={data}", "data.val_fraction=0", f"data.num_folds={folds}",
                                          "data.fold=0"]).data)
    dm.setup("fit")
    n = len(dm.train_tensors[0])
    grid = ",".join(f"{1 / (c * n):.6g}" for c in PAPER_C)
    return [f"model.l2=[{grid}]", "model.cv_folds=3", "model.cv_metric=subset_acc"]


def table1(args: argparse.Namespace, out: Path) -> None:
    """Every (dataset, model) cell over the folds; the table rewritten after each (``--update``: merged into the
    committed rows)."""
    kept = read_rows(out.with_suffix(".csv")) if args.update else []
    rows = []
    for data in args.datasets:
        for model in args.models:
            rows.append(summary_row(data, model, run_folds(cell_overrides(model, data, args), args.folds)))
            print(rows[-1], flush=True)
            write_table(merge_rows(kept, rows, list(MODELS)), out, COLUMNS, footer=FOOTER)


COLUMNS = ["dataset", "model", "microlabel loss %", "0/1 loss %", "paper", "certified %", "gap", "l2", "train s"]
FOOTER = ["", "Mean +- standard deviation over the folds. paper: the paper's Table 1 (microlabel / 0-1 loss) "
          "for the same method. certified: test examples whose ensemble inference is exact (every labelling scored "
          "up to model.exact_labels labels, else Lemma 7's certificate)."]


def summary_row(data: str, model: str, folds: list[dict]) -> dict:
    micro = [100 * (1 - m["test/hamming_acc"]) for m in folds]
    zero_one = [100 * (1 - m["test/subset_acc"]) for m in folds]
    paper = PAPER.get(data, {}).get(model.split("_")[0])
    gaps = [max(_flat(m["solver"].get("relative_gap", math.nan))) for m in folds]
    return {"dataset": data, "model": model, "microlabel loss %": _pm(micro), "0/1 loss %": _pm(zero_one),
            "paper": "" if paper is None else f"{paper[0]} / {paper[1]}",
            "certified %": _pm([100 * m["test/certified"] for m in folds]) if "test/certified" in folds[0] else "",
            "gap": f"{max(gaps):.1e}", "l2": " ".join(str(m.get("cv", {}).get("chosen_l2", "")) for m in folds),
            "train s": round(sum(m["train_seconds"] for m in folds), 1),
            "microlabel folds": " ".join(f"{v:.2f}" for v in micro),
            "0/1 folds": " ".join(f"{v:.2f}" for v in zero_one)}


def figure1(args: argparse.Namespace, out: Path) -> None:
    """Certified fraction of fold-0 test examples against K, for 5, 10 and 40 trees."""
    rows = []
    for data in args.datasets:
        for T in FIGURE_TREES:
            a = argparse.Namespace(**{**vars(args), "trees": T})
            o = [*cell_overrides("rta", data, a), f"data.num_folds={args.folds}", "data.fold=0", "test=false"]
            with tempfile.TemporaryDirectory() as tmp:
                run_config(o, Path(tmp))
                model = RTA.load_from_checkpoint(str(Path(tmp) / "checkpoints" / "last.ckpt"), map_location="cpu")
            dm = build_datamodule(compose_config(o).data)
            dm.setup("test")
            x, _ = dm.test_tensors
            n = dm.num_labels
            model.eval()
            model.hparams.exact_labels = 0  # the K-best search's own certificate (Lemma 7), not the enumeration
            for K in sorted(set(FIGURE_K) | {n}):  # the paper's K values and K = number of labels
                model.hparams.k, model.hparams.k_max = K, K
                with torch.no_grad():
                    certified = model.predict_with_certificate(x)[1]
                rows.append({"dataset": data, "trees": T, "K": K, "K % of labels": round(100 * K / n, 1),
                             "certified %": round(100 * float(certified.float().mean()), 2),
                             "margin": model.margin})
                print(rows[-1], flush=True)
            write_table(rows, Path(f"{out}_figure1"))
    plot_figure1(rows, Path(f"{out}_figure1.png"))


def plot_figure1(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    datasets = sorted({r["dataset"] for r in rows})
    for key in dict.fromkeys((r["dataset"], r["trees"]) for r in rows):
        cell = [r for r in rows if (r["dataset"], r["trees"]) == key]
        style = FIGURE_TREES.index(key[1]) % 3 if key[1] in FIGURE_TREES else 0
        ax.plot([r["K % of labels"] for r in cell], [r["certified %"] for r in cell], marker="os^"[style],
                color=f"C{datasets.index(key[0])}", linestyle=("-", "--", ":")[style],
                label=f"{key[0]}, {key[1]} trees")
    ax.axvline(100, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("K, % of the number of labels")
    ax.set_ylabel("% of test examples certified exact (Lemma 7)")
    ax.set_title("RTA Figure 1: exact K-best inference on the tree ensemble")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _flat(v) -> list[float]:
    return v if isinstance(v, list) else [v]


def _pm(values: list[float]) -> str:
    return "{:.2f} +- {:.2f}".format(*mean_sd(values))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["emotions", "scene", "yeast"])
    ap.add_argument("--models", nargs="+", default=["rta", "svm", "mam"], choices=sorted(MODELS))
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--trees", type=int, default=10)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max-epochs", type=int, default=60)
    ap.add_argument("--set", nargs="*", default=[], help="extra Hydra overrides for the RTA runs")
    ap.add_argument("--mam-l2", default="auto", help="MAM's model.l2 (default: its auto_l2 / N)")
    ap.add_argument("--paper-c", action="store_true", help="RTA's lambda by a 3-fold CV inside each training fold "
                    "over the paper's C grid (PAPER_C), on subset accuracy, instead of model.l2=1e-4")
    ap.add_argument("--figure1", action="store_true", help="Figure 1 instead of Table 1")
    ap.add_argument("--update", action="store_true", help="keep the committed rows that are not rerun")
    ap.add_argument("--out", default=str(ROOT / "experiments/results/rta_table1"))
    args = ap.parse_args()
    out = Path(args.out)
    if args.figure1:
        figure1(args, out)
    else:
        table1(args, out)


if __name__ == "__main__":
    main()
