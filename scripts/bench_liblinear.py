"""Independent against liblinear on the same objective: time to a certified relative duality gap (--tol) and the
objective reached, side by side.

    python scripts/bench_liblinear.py [--datasets emotions scene yeast birds flags tmc2007 medical-like enron-like]
                                      [--C 0.01 0.1] [--solvers dcd lbfgs bcfw] [--max-seconds 600]

Independent's Hamming hinge decomposes into one binary linear SVM per label, and with the bias regularised like a
weight (``bias_reg=1``) its objective lambda/2 (|W|^2 + |b|^2) + (1/N) sum_i sum_j hinge_ij is liblinear's L1-loss
SVM with C = 1 / (lambda N) and a bias feature 1 (``LinearSVC(loss="hinge", intercept_scaling=1)``), one label at a
time; a label constant in the training set has the closed-form optimum w = 0, b = +-1 (liblinear refuses it). Both
objectives are evaluated by the same formula in float64. C = 0.01 is ``model.l2=auto`` (lambda = 100 / N).
Datasets: Mulan training files from the data cache (standardised as the datamodules do) and two synthetic sets
shaped like medical and enron (``structtorch.data.sparse_multilabel``: sparse binary features, rare labels). One
thread each side. Writes scripts/results/bench_liblinear.json.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
from benchutil import write_results
from sklearn.exceptions import ConvergenceWarning
from sklearn.svm import LinearSVC

from structtorch.data import Standardizer, load_mulan, sparse_multilabel
from structtorch.energies import FinleyJoachimsEnergy
from structtorch.progress import time_budget
from structtorch.solvers import BCFW, DualCD, SmoothedLBFGS

SYNTHETIC = {"medical-like": dict(num_examples=333, num_features=1449, num_labels=45),
             "enron-like": dict(num_examples=1123, num_features=1001, num_labels=53)}


def load(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Training set x float64 [N, D] (Mulan: standardised by its own statistics), y long [N, L]."""
    if name in SYNTHETIC:
        x, y = sparse_multilabel(**SYNTHETIC[name])
        return x.double(), y
    x, y = load_mulan(name, "train", progress=False)[:2]
    return Standardizer.fit(x).transform(x).double(), y


def objective(x: torch.Tensor, y: torch.Tensor, W: torch.Tensor, b: torch.Tensor, lam: float) -> float:
    """lambda/2 (|W|^2 + |b|^2) + (1/N) sum_i sum_j max(0, 1 - t_ij (W_j x_i + b_j)), t = 2y - 1, float64."""
    t = 2.0 * y.double() - 1.0
    return float(lam / 2 * ((W ** 2).sum() + (b ** 2).sum()) + (1 - t * (x @ W.T + b)).clamp_min(0).sum(1).mean())


def run_liblinear(x: torch.Tensor, y: torch.Tensor, C: float) -> tuple[float, torch.Tensor, torch.Tensor]:
    """Seconds and (W [L, D], b [L]) of one LinearSVC(hinge) per label (tol 1e-4, up to 100000 iterations)."""
    W, b = torch.zeros(y.shape[1], x.shape[1], dtype=torch.float64), torch.zeros(y.shape[1], dtype=torch.float64)
    xs = x.numpy()
    t0 = time.perf_counter()
    for j in range(y.shape[1]):
        if y[:, j].min() == y[:, j].max():  # constant label: w = 0, b = t
            b[j] = 2.0 * float(y[0, j]) - 1.0
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            svm = LinearSVC(C=C, loss="hinge", intercept_scaling=1.0, tol=1e-4, max_iter=100000).fit(xs, y[:, j])
        W[j], b[j] = torch.from_numpy(svm.coef_[0]), float(svm.intercept_[0])
    return time.perf_counter() - t0, W, b


def run_ours(x: torch.Tensor, y: torch.Tensor, lam: float, solver: str, max_seconds: float, tol: float) -> dict:
    """Seconds, certificate and (W, b) of Independent's energy trained by ``solver`` to a ``tol`` relative gap."""
    energy = FinleyJoachimsEnergy(x.shape[1], y.shape[1]).double()
    t0 = time.perf_counter()
    if solver == "lbfgs":
        opt = SmoothedLBFGS(energy, x, y, lam, bias_reg=1.0, tol=tol)
        info, work = opt.fit(max_iter=100000), opt.iterations
    elif solver == "dcd":
        opt = DualCD(energy, x, y, lam, bias_reg=1.0, tol=tol)
        with time_budget(max_seconds):
            info = opt.fit(max_epochs=100000)
        work = opt.epochs
    else:
        opt, work, info = BCFW(energy, len(x), lam, bias_reg=1.0, tol=tol), 0, None
        gen = torch.Generator().manual_seed(0)
        while time.perf_counter() - t0 < max_seconds and (info is None or not bool(info.converged.all())):
            info = opt.fit(x, y, max_epochs=5, generator=gen)
            work += 5
    return {"seconds": time.perf_counter() - t0, "work": work, "gap": float(info.relative_gap),
            "certified": bool(info.converged), "W": energy.unary.weight.detach(), "b": energy.unary.bias.detach()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+",
                    default=["emotions", "scene", "yeast", "birds", "flags", "medical-like", "enron-like", "tmc2007"])
    ap.add_argument("--C", nargs="+", type=float, default=[0.01, 0.1])
    ap.add_argument("--solvers", nargs="+", default=["dcd", "lbfgs", "bcfw"], choices=["dcd", "lbfgs", "bcfw"])
    ap.add_argument("--max-seconds", type=float, default=600.0, help="cap on each BCFW and DCD run")
    ap.add_argument("--tol", type=float, default=1e-3,
                    help="relative gap to certify (5e-3: within 0.5%% of the optimum, the issue's bar)")
    ap.add_argument("--out", default="scripts/results/bench_liblinear.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    print(f"{'data':13} {'C':>5} {'N':>6} {'D':>5} {'L':>4} {'liblinear s':>11} | "
          + " | ".join(f"{s:>5} s {'x lib':>6} {'P/P_lib-1':>9} {'gap':>7}" for s in args.solvers))
    for name in args.datasets:
        x, y = load(name)
        for C in args.C:
            lam = 1.0 / (C * len(x))
            t_lib, W, b = run_liblinear(x, y, C)
            p_lib = objective(x, y, W, b, lam)
            row = {"dataset": name, "C": C, "lambda": lam, "N": len(x), "D": x.shape[1], "L": y.shape[1],
                   "liblinear_seconds": t_lib, "liblinear_objective": p_lib}
            cells = []
            for solver in args.solvers:
                r = run_ours(x, y, lam, solver, args.max_seconds, args.tol)
                p = objective(x, y, r["W"], r["b"], lam)
                row |= {f"{solver}_seconds": r["seconds"], f"{solver}_work": r["work"], f"{solver}_gap": r["gap"],
                        f"{solver}_certified": r["certified"], f"{solver}_objective": p,
                        f"{solver}_time_ratio": r["seconds"] / t_lib, f"{solver}_objective_excess": p / p_lib - 1}
                cells.append(f"{r['seconds']:7.1f} {r['seconds'] / t_lib:6.1f} {p / p_lib - 1:9.1e} {r['gap']:7.1e}"
                             + ("" if r["certified"] else "!"))
            rows.append(row)
            print(f"{name:13} {C:5g} {len(x):6d} {x.shape[1]:5d} {y.shape[1]:4d} {t_lib:11.2f} | " + " | ".join(cells),
                  flush=True)
            write_results(args.out, rows, torch.device("cpu"), tol=args.tol, bias_reg=1.0,
                          note="P/P_lib-1 < 0: ours is below liblinear's (its tol 1e-4 is not a certificate)")


if __name__ == "__main__":
    main()
