"""CRANK Figure 1 (Meshi et al., UAI 2013): test performance against training-set size on synthetic tree data.

    python experiments/crank_figure1.py [--sizes 25 50 100 200 400] [--reps 10]
                                        [--models crank full greedy project mst independent] [--l2 0.01]
                                        [--out experiments/results/crank_figure1] [--resume]

Protocol (the paper's Sec. 5, "Synthetic Data"): x in R^4, a random tree T over n = 10 labels and weights
w in W_T on it (``structtorch.data.crank_synthetic``: uniform random spanning tree, Gaussian unary and
edge weights, labels = exact MAP of the true model); a test set of 1000 and training sets of each size in
``--sizes``; each point is averaged over ``--reps`` repetitions (the paper's 10). Repetition r is
``data.seed=r``: it draws the tree, the weights, the test set and the training set, so every model and
every size of one repetition sees the same true tree and test set, and a smaller training set is a prefix
of a larger one. Each run is one call of the CLI code path (``structtorch.train.run`` on the composed Hydra
config ``+experiment=crank_table1 model=<m> data=synthetic data.num_train=<size> data.num_test=1000
data.seed=<r> model.l2=<l2> model.spin=false``: the generator's pairwise score w_ij y_i y_j), trained on the
whole training set (no validation split) and scored once on the test set. Edge recovery is the fraction of
the true tree's n - 1 = 9 edges in the learned structure, for the models whose learned structure is a forest
(CRANK, Greedy, Project, MST); blank for Full and Empty.

Writes <out>_runs.md / .csv (every run; rewritten after each run, so a long job keeps what it has; ``--resume``
keeps the runs already there and runs only the missing (size, rep, model) triples),
<out>.md / .csv (mean and 2 standard errors over the repetitions per size x model) and <out>.png (Hamming,
0/1 and example-F1 accuracy against the training-set size, log x axis, mean +- 2 SE per model).

Deviations from the paper: one fixed l2 (``--l2``, default 0.01) for every model, size and repetition
instead of the paper's cross-validated regularisation (CRANK has no l2 grid here; CRANK's ``restarts``
already use the batch dimension); the paper does not state its training-set sizes or the distribution
of w, so ``--sizes`` and the generator's weight scales (``crank_synthetic``'s defaults) are ours; our
solvers replace the paper's stochastic Frank-Wolfe and GLPK.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path

from crank_table1 import MODELS
from runner import ROOT, compose_config, run_config
from tables import SCORES, percents, plot_curves, read_rows, summarize, write_table

from structtorch import Graph
from structtorch.data import crank_synthetic
from structtorch.metrics import edge_recovery

NO_TREE = {"full", "independent"}  # no edge recovery: Full is the complete graph, Empty has no edges
METRICS = dict(zip(SCORES, ("Hamming", "0/1", "F1")))
PAPER_FINDING = ("Paper (Fig. 1): the structured models do significantly better than Empty; Full, Greedy and "
                 "CRANK are comparable (slight advantage CRANK); Project and MST do much worse than the other "
                 "structured models.")


def run_overrides(model: str, size: int, rep: int, l2: float) -> list[str]:
    """The Hydra overrides of one run."""
    return ["+experiment=crank_table1", f"model={model}", "data=synthetic", f"data.num_train={size}",
            "data.num_test=1000", f"data.seed={rep}", f"model.l2={l2}", "model.spin=false", "data.val_fraction=0",
            "trainer.max_epochs=200"]


def true_tree(overrides: list[str]) -> Graph:
    """The true tree of the run's data, drawn as ``SyntheticDataModule._load`` draws it."""
    d = compose_config(overrides).data
    return crank_synthetic(d.num_train, d.num_test, d.num_labels, d.num_features, seed=d.seed,
                           pairwise_scale=d.pairwise_scale).tree


def recovery(structure: dict, truth: Graph) -> float:
    """The fraction of the true tree's edges in a run's learned structure (``metrics.edge_recovery``'s recall)."""
    learned = Graph(truth.num_nodes, [[int(a[1:]), int(b[1:])] for a, b, _ in structure["edges"]])  # "y0".."y9"
    return round(edge_recovery(learned, truth)["recall"], 3)


def row(model: str, size: int, rep: int, l2: float, m: dict, truth: Graph) -> dict:
    structure = m["structure"]
    forest = model not in NO_TREE and structure["is_forest"]
    return {"size": size, "rep": rep, "model": MODELS[model], "l2": l2, **percents(m, "test/"),
            "edge recovery": recovery(structure, truth) if forest else "",
            "edges": structure["num_edges"], "converged": m["solver"].get("converged"),
            "train s": round(m["train_seconds"], 1), "test s": round(m["test_seconds"], 3),
            "tree": " ".join(f"{a}~{b}" for a, b, _ in structure["edges"]) if forest else "",
            "true tree": " ".join(f"y{a}~y{b}" for a, b in sorted((min(e), max(e)) for e in truth.edges.tolist()))}


def write(rows: list[dict], out: Path, final: bool) -> None:
    runs_columns = ["size", "rep", "model", "l2", *METRICS, "edge recovery", "edges", "converged", "train s", "test s"]
    with contextlib.redirect_stdout(io.StringIO()):  # the growing per-run table is not re-printed every run
        write_table(rows, out.parent / (out.name + "_runs"), runs_columns)
    if final:
        summary = summarize(rows, ["size", "model"], [*METRICS, "edge recovery", "train s"])
        footer = ["", f"Mean and 2 standard errors (columns '... 2se') over 'runs' repetitions; accuracies in %. "
                      f"Edge recovery: fraction of the true tree's edges in the learned forest. l2 = "
                      f"{sorted({r['l2'] for r in rows})}.", "", PAPER_FINDING]
        write_table(summary, out, footer=footer)
        plot_curves(summary, "size", "model", METRICS, out.parent / (out.name + ".png"),
                    "Synthetic tree data (n = 10 labels, x in R^4, test 1000): mean +- 2 SE over repetitions",
                    "training samples")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", type=int, default=[25, 50, 100, 200, 400])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--l2", type=float, default=0.01, help="one l2 for every model (no CV; see the docstring)")
    ap.add_argument("--out", default=str(ROOT / "experiments/results/crank_figure1"))
    ap.add_argument("--resume", action="store_true", help="keep <out>_runs.csv's runs, run only the missing ones")
    args = ap.parse_args()
    out = Path(args.out)
    rows: list[dict] = read_rows(out.parent / (out.name + "_runs.csv")) if args.resume else []
    done = {(r["size"], r["rep"], r["model"]) for r in rows}
    try:
        for rep in range(args.reps):  # repetitions outermost: a stopped job keeps whole curves
            for size in args.sizes:
                truth = None
                for model in args.models:
                    if (size, rep, MODELS[model]) in done:
                        continue
                    o = run_overrides(model, size, rep, args.l2)
                    truth = truth or true_tree(o)  # same data.seed: the same tree for every model
                    rows.append(row(model, size, rep, args.l2, run_config(o), truth))
                    print({k: v for k, v in rows[-1].items() if k not in ("tree", "true tree")}, flush=True)
                    write(rows, out, final=False)  # after every run: a long job keeps what it has measured
    finally:
        if rows:
            write(rows, out, final=True)


if __name__ == "__main__":
    main()
