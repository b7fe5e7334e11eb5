"""Bradley & Guestrin (ICML 2010) Figures 3 and 4: tree-CRF structure learning on synthetic data.

    python experiments/tree_crf_synthetic.py [--figures 3 4] [--models 5] [--sizes 50 100 200 500]
        [--labels 10 20 40] [--methods piecewise local_cmi dci global_cmi] [--global-cmi-max 50]
        [--global-cmi-labels 20]
        [--l2 0.1] [--out experiments/results/tree_crf_synthetic] [--summarize-only]

Data (``tree_crf_synthetic``, the paper's Fig. 3/4 setting): tree CRFs P(Y|X) with intractable joints,
associative factors alternating +-4 (Y-Y), +-2 (Y-X), +-1 (X-X), cross factors, one input X_i per
label (the true input mapping is given), 1000 test examples. Figure 3: 40 labels, training size
varied; Figure 4: 50 training examples, number of labels varied. Each point averages ``--models``
random models (paper: 10), with 2-standard-error bars.

For each edge score: the max spanning tree of the scores (conditionals from count tables on the
local inputs; global CMI's from logistic regressions on all inputs with 5-fold CV over the paper's
10 penalties, all pairs batched), then a tree CRF with factors on local inputs fitted by l2
conditional likelihood (``SmoothedLBFGS`` at eps = 1, certified to a 1e-3 relative duality gap).
Baselines: disconnected CRFs prod_i P(Y_i | X_i) (local inputs) and prod_i P(Y_i | X) (global
inputs), and the true tree (structure given). Metrics: edge recovery (fraction of true edges
found), edge ranking (fraction of (true, false) edge pairs scored in that order), test 0/1 accuracy,
test conditional log-likelihood per example, structure-learning time (edge scores and tree, the
paper's "training time") and parameter-learning time. Global CMI runs only where
there are at most ``--global-cmi-max`` training examples and ``--global-cmi-labels`` labels: its
pair regressions on all inputs cost O(n^2 * n^2) per Newton step (40 labels would take ~30 min
per model on a 2-core CPU). Writes <out>.csv, <out>.md and <out>_fig3.png / <out>_fig4.png.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
from runner import ROOT
from tables import plot_curves, read_rows, summarize, write_table

from structtorch import Graph
from structtorch.data import TreeCRFSynthetic, tree_crf_synthetic
from structtorch.energies import LocalLinearEnergy
from structtorch.estimation import edge_scores
from structtorch.inference import tree_map
from structtorch.losses import crf_nll
from structtorch.metrics import edge_recovery, multilabel_scores
from structtorch.solvers import SmoothedLBFGS
from structtorch.structure import max_spanning_tree

BASELINES = ("disconnected_local", "disconnected_global", "true_tree")
METRICS = ("edge_recovery", "edge_ranking", "test_01_acc", "test_loglik", "structure_s", "crf_s")


def structure(d: TreeCRFSynthetic, method: str) -> tuple[Graph, torch.Tensor | None, float]:
    """The learned tree of ``method`` (or a baseline's graph), its edge scores on ``Graph.complete(n)``
    (None for the baselines) and the seconds they took."""
    n = d.num_labels
    if method == "true_tree":
        return d.tree, None, 0.0
    if method.startswith("disconnected"):
        return Graph.empty(n), None, 0.0
    t = time.perf_counter()
    scores = edge_scores(d.x_train, d.y_train, method, inputs=d.inputs)
    mask = max_spanning_tree(scores, Graph.complete(n))
    return Graph(n, Graph.complete(n).edges[mask]), scores, time.perf_counter() - t


def edge_ranking(scores: torch.Tensor, true_mask: torch.Tensor) -> float:
    """Fraction of (true, false) edge pairs with the true edge scored higher (ties count half)."""
    diff = scores[true_mask][:, None] - scores[~true_mask][None, :]
    return float((diff > 0).double().mean() + 0.5 * (diff == 0).double().mean())


def fit_crf(d: TreeCRFSynthetic, graph: Graph, local_unary: bool, l2: float) -> LocalLinearEnergy:
    """A tree CRF on ``graph`` with factors on the local inputs, by l2 conditional likelihood."""
    n = d.num_labels
    energy = LocalLinearEnergy(n, n, num_inputs=1, graph=graph, local_unary=local_unary).double()
    energy.set_inputs(d.inputs)
    solver = SmoothedLBFGS(energy, d.x_train.double(), d.y_train, l2, margin_scale=0.0, eps=1.0)
    solver.fit()
    return energy


def evaluate(d: TreeCRFSynthetic, method: str, l2: float) -> dict:
    graph, scores, seconds = structure(d, method)
    t = time.perf_counter()
    energy = fit_crf(d, graph, local_unary=method != "disconnected_global", l2=l2)
    crf_seconds = time.perf_counter() - t
    with torch.no_grad():
        pot = energy(d.x_test.double())
        y_hat = tree_map(pot)[1]
        ll = -float(crf_nll(pot, d.y_test).mean())
    return {"edge_recovery": edge_recovery(graph, d.tree)["recall"] if graph.num_edges else float("nan"),
            "edge_ranking": float("nan") if scores is None else edge_ranking(scores, d.tree_edge_mask()),
            "test_01_acc": multilabel_scores(y_hat, d.y_test)["subset_acc"], "test_loglik": ll,
            "structure_s": float("nan") if scores is None else seconds, "crf_s": crf_seconds}


def run_figure(figure: int, args: argparse.Namespace) -> list[dict]:
    settings = [(s, 40) for s in args.sizes] if figure == 3 else [(50, n) for n in args.labels]
    rows = []
    for num_train, num_labels in settings:
        for seed in range(args.models):
            d = tree_crf_synthetic(num_train, 1000, num_labels=num_labels, seed=seed)
            for method in [*args.methods, *BASELINES]:
                if method == "global_cmi" and (num_train > args.global_cmi_max or num_labels > args.global_cmi_labels):
                    continue
                r = evaluate(d, method, args.l2)
                rows.append({"figure": figure, "num_train": num_train, "num_labels": num_labels, "seed": seed,
                             "method": method, **{k: "" if math.isnan(v) else round(v, 4) for k, v in r.items()}})
                print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--figures", nargs="+", type=int, default=[3, 4], choices=[3, 4])
    ap.add_argument("--models", type=int, default=5)
    ap.add_argument("--sizes", nargs="+", type=int, default=[50, 100, 200, 500])
    ap.add_argument("--labels", nargs="+", type=int, default=[10, 20, 40])
    ap.add_argument("--methods", nargs="+", default=["piecewise", "local_cmi", "dci", "global_cmi"])
    ap.add_argument("--global-cmi-max", type=int, default=50)
    ap.add_argument("--global-cmi-labels", type=int, default=20)
    ap.add_argument("--l2", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "experiments/results/tree_crf_synthetic"))
    ap.add_argument("--summarize-only", action="store_true", help="redo the summary and figures from <out>_runs.csv")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    runs = out.with_name(out.name + "_runs")
    if args.summarize_only:
        rows = read_rows(runs.with_suffix(".csv"))
    else:
        rows = [r for fig in args.figures for r in run_figure(fig, args)]
        write_table(rows, runs)
    summary = summarize(rows, ["figure", "num_train", "num_labels", "method"], list(METRICS))
    write_table(summary, out)
    for fig in args.figures:
        x = "num_train" if fig == 3 else "num_labels"
        plot_curves([s for s in summary if s["figure"] == fig], x, "method", {m: m for m in METRICS[:5]},
                    out.with_name(f"{out.name}_fig{fig}.png"), f"Tree CRFs, Bradley & Guestrin Fig. {fig} setting "
                    f"({'40 labels' if fig == 3 else '50 training examples'}; 1000 test): mean +- 2 SE",
                    "training examples" if fig == 3 else "labels (= inputs)", log_y=("structure_s",))


if __name__ == "__main__":
    main()
