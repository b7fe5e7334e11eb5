"""Batched cross-validated pair regressions (the edge scores' conditionals) vs scikit-learn one fit at a time.

    .venv/bin/python scripts/bench_conditionals.py [--dataset yeast] [--pairs K] [--threads 1]
                                                   [--out scripts/results/bench_conditionals.json]
    .venv/bin/python scripts/bench_conditionals.py --dataset tree_crf_synthetic --out <json>

On a Mulan training split (inputs standardised as ``conditional_log_probs`` does), with the input
mapping ``select_inputs(x, y, 10)`` (or the paper's 40-label synthetic tree CRF with its true inputs,
all 40 * 39 / 2 = 780 pairs): for every label pair (i, j) (the first ``--pairs`` of
``Graph.complete(L)``), a multinomial logistic regression of the 4 joint states of (Y_i, Y_j) on
X_ij = X_i u X_j, its l2 penalty chosen by 5-fold CV (summed held-out log-likelihood) over the 10
values of ``LAMBDA_GRID``, then refit on all examples. Timed, side by side:

  batched   ``logistic_cv_log_probs``: every fold x lambda x pair, and every lambda on all data, in
            one batched Newton program (one call)
  sklearn   ``LogisticRegression(C=1/lambda, solver="lbfgs", tol=1e-6)`` fitted one pair, one fold,
            one lambda at a time on the same folds (examples of the held-out fold dropped), then one
            refit per pair with its chosen lambda (sklearn's intercept is unpenalised, ours has a 1e-6
            ridge; a fold that holds only 2 classes is a binary fit, whose C = 2/lambda matches our
            2-class multinomial penalty)

Reported: both times, their ratio, the number of fits, how often both chose the same lambda and
the largest |P_batched - P_sklearn| of the chosen whole-data models (over all pairs, and over the
pairs with the same choice).
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch
from benchutil import write_results
from sklearn.linear_model import LogisticRegression
from threadpoolctl import threadpool_limits

from structtorch import Graph
from structtorch.data import fold_assignment, load_mulan_splits, tree_crf_synthetic
from structtorch.energies.local import pair_inputs
from structtorch.structure import LAMBDA_GRID, select_inputs
from structtorch.structure.conditionals import logistic_cv_log_probs, pad_subsets

NUM_CLASSES = 4  # joint states of a label pair


def load(name: str, num_inputs: int, pairs: int | None, num_train: int
         ) -> tuple[torch.Tensor, torch.Tensor, list[list[int]], float]:
    """Standardised x [N, D] float64, pair targets [P, N], the pairs' input columns, select_inputs seconds.
    ``tree_crf_synthetic``: the paper's 40-label synthetic tree CRF, ``num_train`` examples, true inputs."""
    if name == "tree_crf_synthetic":
        data = tree_crf_synthetic(num_train, 1, num_labels=40, seed=0)
        x, y, inputs, seconds = data.x_train.double(), data.y_train.long(), data.inputs, 0.0
    else:
        data = load_mulan_splits(name, progress=False)
        x, y = data.x_train.double(), data.y_train.long()
    x = (x - x.mean(0)) / x.std(0, unbiased=False).clamp_min(1e-12)
    if name != "tree_crf_synthetic":
        t0 = time.perf_counter()
        inputs = select_inputs(x, y, num_inputs)
        seconds = time.perf_counter() - t0
    edges = Graph.complete(y.shape[1]).edges[:pairs]
    return x, (y[:, edges[:, 0]] * 2 + y[:, edges[:, 1]]).T.contiguous(), pair_inputs(inputs, edges), seconds


def sklearn_fit(x: np.ndarray, t: np.ndarray, lam: float, tol: float) -> LogisticRegression:
    classes = len(np.unique(t))
    c = (2.0 if classes == 2 else 1.0) / lam  # binary sklearn fit = our 2-class multinomial at C = 2/lambda
    return LogisticRegression(C=c, solver="lbfgs", tol=tol, max_iter=10000).fit(x, t)


def sklearn_proba(model: LogisticRegression, x: np.ndarray) -> np.ndarray:
    """predict_proba with a column for every joint state (0 for states absent from the fit)."""
    out = np.zeros((len(x), NUM_CLASSES))
    out[:, model.classes_] = model.predict_proba(x)
    return out


def sklearn_cv(x: np.ndarray, t: np.ndarray, fold: np.ndarray, tol: float) -> tuple[int, np.ndarray, int]:
    """One pair: CV over the grid one fold, one lambda at a time, then the refit: (chosen index,
    whole-data probabilities [N, C], number of fits)."""
    cv = []
    for lam in LAMBDA_GRID:
        total = 0.0
        for f in range(int(fold.max()) + 1):
            tr, te = fold != f, fold == f
            p = sklearn_proba(sklearn_fit(x[tr], t[tr], lam, tol), x[te])[np.arange(te.sum()), t[te]]
            total += float(np.log(np.maximum(p, 1e-300)).sum())
        cv.append(total)
    best = int(np.argmax(cv))
    return best, sklearn_proba(sklearn_fit(x, t, LAMBDA_GRID[best], tol), x), len(cv) * (int(fold.max()) + 1) + 1


def run_sklearn(x: torch.Tensor, target: torch.Tensor, pair_inputs: list[list[int]], fold: torch.Tensor,
                tol: float) -> tuple[float, np.ndarray, np.ndarray, int]:
    """Seconds, chosen indices [P], probabilities [P, N, C] and the number of fits of the sklearn baseline."""
    xn, tn, fn = x.numpy(), target.numpy(), fold.numpy()
    best, probs, fits = [], [], 0
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for r, cols in enumerate(pair_inputs):
            b, p, n = sklearn_cv(xn[:, cols], tn[r], fn, tol)
            best.append(b)
            probs.append(p)
            fits += n
    return time.perf_counter() - t0, np.array(best), np.stack(probs), fits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="yeast", help="a Mulan name, or tree_crf_synthetic (40 labels)")
    ap.add_argument("--num-train", type=int, default=500, help="tree_crf_synthetic's training size")
    ap.add_argument("--pairs", type=int, default=None, help="only the first K label pairs (quick run)")
    ap.add_argument("--threads", type=int, default=1, help="torch and BLAS threads (both sides)")
    ap.add_argument("--inputs", type=int, default=10, help="inputs per label (select_inputs)")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0, help="fold seed")
    ap.add_argument("--tol", type=float, default=1e-6, help="sklearn's tol")
    ap.add_argument("--out", default="scripts/results/bench_conditionals.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with threadpool_limits(args.threads):
        x, target, pair_cols, select_s = load(args.dataset, args.inputs, args.pairs, args.num_train)
        P, (N, D), G, k = len(pair_cols), x.shape, len(LAMBDA_GRID), args.folds
        subsets = pad_subsets(pair_cols, D)
        fold = fold_assignment(N, k, args.seed)
        t0 = time.perf_counter()
        ours, our_best = logistic_cv_log_probs(x, target, subsets, NUM_CLASSES, LAMBDA_GRID, k, args.seed)
        batched_s = time.perf_counter() - t0
        sk_s, sk_best, sk_probs, sk_fits = run_sklearn(x, target, pair_cols, fold, args.tol)
    diff = np.abs(ours.exp().numpy() - sk_probs).max((1, 2))  # [P]
    same = our_best.numpy() == sk_best
    row = {"dataset": args.dataset, "N": N, "D": D, "pairs": P, "max_inputs": subsets.shape[1],
           "mean_inputs": float(np.mean([len(c) for c in pair_cols])), "lambdas": G, "folds": k,
           "batched_models": P * G * (k + 1), "sklearn_fits": sk_fits, "batched_seconds": batched_s,
           "sklearn_seconds": sk_s, "sklearn_over_batched": sk_s / batched_s, "select_inputs_seconds": select_s,
           "same_lambda": int(same.sum()), "max_abs_prob_diff": float(diff.max()),
           "max_abs_prob_diff_same_lambda": float(diff[same].max()) if same.any() else None,
           "batched_lambda_counts": np.bincount(our_best.numpy(), minlength=G).tolist(),
           "sklearn_lambda_counts": np.bincount(sk_best, minlength=G).tolist()}
    print(f"{'data':7} {'N':>5} {'pairs':>5} {'P':>3} {'models':>7} {'sk fits':>7} {'batched s':>9} "
          f"{'sklearn s':>9} {'sk/batched':>10} {'same lam':>8} {'max|dp|':>8} {'same-lam max|dp|':>16}")
    same_diff = row["max_abs_prob_diff_same_lambda"]
    print(f"{args.dataset:7} {N:5d} {P:5d} {subsets.shape[1]:3d} {row['batched_models']:7d} {sk_fits:7d} "
          f"{batched_s:9.1f} {sk_s:9.1f} {row['sklearn_over_batched']:10.1f} {row['same_lambda']:>4d}/{P:<3d} "
          f"{row['max_abs_prob_diff']:8.1e} {same_diff if same_diff is None else format(same_diff, '16.1e')}")
    print(f"lambda choices (grid index counts)  batched {row['batched_lambda_counts']}  "
          f"sklearn {row['sklearn_lambda_counts']}")
    write_results(args.out, [row], torch.device("cpu"), threads=args.threads, sklearn_tol=args.tol,
                  sklearn_solver="lbfgs", lambda_grid=list(LAMBDA_GRID), seed=args.seed)


if __name__ == "__main__":
    main()
