"""Time to a certified 1e-3 relative duality gap: smoothed L-BFGS and BCFW (last iterate and weighted average)
vs libsvm (per-label SVC) vs minibatch Adam, side by side on the same objective.

Independent model (Finley-Joachims energy, no edges, Hamming hinge): one binary SVM per label, so
per-label ``sklearn.svm.SVC(kernel="linear", C=1/(lambda N))`` gives the exact optimum
P* = sum_labels lambda * (libsvm primal) (unregularised bias). ``SmoothedLBFGS`` (the learners'
default, bias_reg 1e-4) and ``BCFW`` (bias_reg 1e-2) regularise the bias with weight lambda * bias_reg
and stop on their own certificate; we report their objective's distance to P* (bias
unregularised). BCFW runs twice from the same seed: certifying its last iterate (``bcfw``) and the
weighted average of its iterates (``bcfw_avg``, ``averaging=True``: an exact gap every epoch); each is
capped at --bcfw-max-seconds. Adam is the gradient path: minibatch Adam
(lr 0.01, cosine, batch 64) for a fixed number of epochs (it has no certificate); we report its
final distance to P*. Training split, standardised, float64, one thread.

    .venv/bin/python scripts/bench_solvers.py [--datasets scene emotions yeast] [--lams 1 0.1 0.01 0.001]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch
from benchutil import write_results
from sklearn.svm import SVC

from structtorch.data import Standardizer, load_mulan
from structtorch.energies import FinleyJoachimsEnergy
from structtorch.solvers import BCFW, SmoothedLBFGS


def load(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Training split (the package's data cache, fetched by name where missing), standardised with its own
    mean/std: x float64 [N, D], y long [N, L]."""
    x, y, _, _ = load_mulan(name, "train", progress=False)
    return Standardizer.fit(x).transform(x).double(), y


def primal(x: torch.Tensor, y: torch.Tensor, W: torch.Tensor, b: torch.Tensor, lam: float) -> float:
    """Independent hinge objective, bias unregularised."""
    t = 2.0 * y.double() - 1.0
    return float(lam / 2 * (W ** 2).sum() + (1 - t * (x @ W.T + b)).clamp_min(0).sum(1).mean())


def run_libsvm(x, y, lam):
    t0 = time.perf_counter()
    W, b = [], []
    for j in range(y.shape[1]):  # libsvm's default tol (1e-3): tol=1e-6 stalls on a yeast label
        c = SVC(kernel="linear", C=1.0 / (lam * len(x))).fit(x.numpy(), y[:, j].numpy())
        W.append(c.coef_[0])
        b.append(c.intercept_[0])
    return time.perf_counter() - t0, primal(x, y, torch.tensor(np.array(W)), torch.tensor(np.array(b)), lam)


def run_lbfgs(x, y, lam):
    energy = FinleyJoachimsEnergy(x.shape[1], y.shape[1]).double()
    t0 = time.perf_counter()
    solver = SmoothedLBFGS(energy, x, y, lam, tol=1e-3)
    info = solver.fit(max_iter=50000)
    seconds = time.perf_counter() - t0
    return seconds, solver.iterations, info, primal(x, y, energy.unary.weight.detach(), energy.unary.bias.detach(), lam)


def run_bcfw(x, y, lam, max_seconds, averaging=False):
    energy = FinleyJoachimsEnergy(x.shape[1], y.shape[1]).double()
    solver = BCFW(energy, len(x), lam, tol=1e-3, averaging=averaging)
    gen, t0, epochs, info = torch.Generator().manual_seed(0), time.perf_counter(), 0, None
    while time.perf_counter() - t0 < max_seconds:
        info = solver.fit(x, y, max_epochs=10, generator=gen)
        epochs += 10
        if bool(info.converged.all()):
            break
    seconds = time.perf_counter() - t0
    return seconds, epochs, info, primal(x, y, energy.unary.weight.detach(), energy.unary.bias.detach(), lam)


def run_adam(x, y, lam, epochs):
    energy = FinleyJoachimsEnergy(x.shape[1], y.shape[1]).double()
    opt = torch.optim.Adam(energy.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.5 * (1 + math.cos(math.pi * e / epochs)))
    gen, t0 = torch.Generator().manual_seed(0), time.perf_counter()
    W, b = energy.unary.weight, energy.unary.bias
    for _ in range(epochs):
        for i in torch.randperm(len(x), generator=gen).split(64):
            opt.zero_grad()
            t = 2.0 * y[i].double() - 1.0
            loss = lam / 2 * (W ** 2).sum() + (1 - t * (x[i] @ W.T + b)).clamp_min(0).sum(1).mean()
            loss.backward()
            opt.step()
        sched.step()
    return time.perf_counter() - t0, primal(x, y, W.detach(), b.detach(), lam)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["scene", "emotions", "yeast"])
    ap.add_argument("--lams", nargs="+", type=float, default=[1.0, 0.1, 0.01, 0.001])
    ap.add_argument("--adam-epochs", type=int, default=100)
    ap.add_argument("--bcfw-max-seconds", type=float, default=60.0, help="cap on each BCFW run")
    ap.add_argument("--out", default="scripts/results/bench_solvers.json")
    args = ap.parse_args()
    rows = []
    torch.set_num_threads(1)
    print(f"{'data':9} {'lambda':>7} {'N':>5} {'libsvm s':>8} | {'lbfgs s':>7} {'iters':>6} {'gap':>7} {'P/P*-1':>8} | "
          f"{'bcfw s':>6} {'epochs':>6} {'gap':>7} {'P/P*-1':>8} | "
          f"{'avg s':>6} {'epochs':>6} {'gap':>7} {'P/P*-1':>8} | "
          f"{'adam s':>6} {'P/P*-1':>8} | {'lbfgs/libsvm':>12} {'bcfw/libsvm':>11} {'avg/bcfw':>8} {'lbfgs/adam':>10}")
    for name in args.datasets:
        x, y = load(name)
        for lam in args.lams:
            t_svm, p_star = run_libsvm(x, y, lam)
            t_lbfgs, iters, linfo, p_lbfgs = run_lbfgs(x, y, lam)
            t_bcfw, epochs, info, p_bcfw = run_bcfw(x, y, lam, args.bcfw_max_seconds)
            t_avg, avg_epochs, ainfo, p_avg = run_bcfw(x, y, lam, args.bcfw_max_seconds, averaging=True)
            t_adam, p_adam = run_adam(x, y, lam, args.adam_epochs)
            row = {"dataset": name, "lambda": lam, "N": len(x), "D": x.shape[1], "L": y.shape[1],
                   "libsvm_seconds": t_svm, "p_star": p_star,
                   "lbfgs_seconds": t_lbfgs, "lbfgs_iterations": iters,
                   "lbfgs_certified_relative_gap": float(linfo.relative_gap), "lbfgs_converged": bool(linfo.converged),
                   "lbfgs_rel_excess": p_lbfgs / p_star - 1,
                   "bcfw_seconds": t_bcfw, "bcfw_epochs": epochs,
                   "bcfw_certified_relative_gap": float(info.relative_gap), "bcfw_converged": bool(info.converged),
                   "bcfw_rel_excess": p_bcfw / p_star - 1,
                   "bcfw_avg_seconds": t_avg, "bcfw_avg_epochs": avg_epochs,
                   "bcfw_avg_certified_relative_gap": float(ainfo.relative_gap),
                   "bcfw_avg_converged": bool(ainfo.converged), "bcfw_avg_rel_excess": p_avg / p_star - 1,
                   "adam_epochs": args.adam_epochs,
                   "adam_seconds": t_adam, "adam_rel_excess": p_adam / p_star - 1}
            rows.append(row)
            print(f"{name:9} {lam:7.3g} {len(x):5d} {t_svm:8.2f} | {t_lbfgs:7.2f} {iters:6d} "
                  f"{row['lbfgs_certified_relative_gap']:7.1e} {row['lbfgs_rel_excess']:8.1e} | {t_bcfw:6.1f} "
                  f"{epochs:6d} {row['bcfw_certified_relative_gap']:7.1e} {row['bcfw_rel_excess']:8.1e} | {t_avg:6.1f} "
                  f"{avg_epochs:6d} {row['bcfw_avg_certified_relative_gap']:7.1e} {row['bcfw_avg_rel_excess']:8.1e} | "
                  f"{t_adam:6.1f} {row['adam_rel_excess']:8.1e} | {t_lbfgs / t_svm:12.1f} {t_bcfw / t_svm:11.0f} "
                  f"{t_avg / t_bcfw:8.2f} {t_lbfgs / t_adam:10.2f}", flush=True)
            # written after every row: an interrupted run keeps its rows
            write_results(args.out, rows, torch.device("cpu"), tol=1e-3, lbfgs_bias_reg=1e-4, bcfw_bias_reg=1e-2,
                          dtype="float64", threads=1, bcfw_max_seconds=args.bcfw_max_seconds)


if __name__ == "__main__":
    main()
