"""BCFW and smoothed L-BFGS (certified structured SVMs) and L-BFGS against exact references (sklearn SVC,
scipy, brute-force enumeration)."""

from __future__ import annotations

import weakref

import numpy as np
import pytest
import torch
from conftest import cached_mulan
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize
from sklearn.svm import SVC
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from structtorch.data import Standardizer
from structtorch.energies import FinleyJoachimsEnergy, LinearTableEnergy, LocalLinearEnergy, TreeEnsembleEnergy
from structtorch.graph import Graph
from structtorch.inference import lp_map, smoothed_lp
from structtorch.losses import crf_nll, hamming_augment
from structtorch.optim import backtrack
from structtorch.potentials import Potentials
from structtorch.solvers import (
    BCFW,
    BatchedLBFGS,
    EnsembleOracle,
    GapInfo,
    LPSmoothedMax,
    SmoothedLBFGS,
    one_hot_marginals,
    smoothed_oracle,
    tree_oracle,
)
from structtorch.solvers.active_set import pair_index, weighted_marginals
from structtorch.solvers.smoothing import SquaredRows, label_bias_shift, pair_bias_shift
from structtorch.structure import random_spanning_trees


def mulan_subset(name: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """First n training rows (from the data cache; skipped without it), standardised, float64 x [n, D] and
    y [n, L]."""
    x, y, _, _ = cached_mulan(name, "train")
    x, y = x[:n], y[:n]
    return Standardizer.fit(x).transform(x).double(), y


def independent_primal(x, y, W, b, lam, rho=0.0):
    """The Independent hinge objective (margin 1): sum over labels of binary SVM primals."""
    t = 2.0 * y.double() - 1.0
    return lam / 2 * ((W ** 2).sum() + rho * (b ** 2).sum()) + (1 - t * (x @ W.T + b)).clamp_min(0).sum(1).mean()


def svc_optimum(x, y, lam):
    """Exact per-label libsvm solution (unregularised bias): W [L, D], b [L]; C = 1 / (lambda N)."""
    W, b = [], []
    for j in range(y.shape[1]):
        c = SVC(kernel="linear", C=1.0 / (lam * len(x)), tol=1e-8).fit(x.numpy(), y[:, j].numpy())
        W.append(c.coef_[0])
        b.append(c.intercept_[0])
    return torch.tensor(np.array(W)), torch.tensor(np.array(b))


@pytest.mark.parametrize("name,n,lams", [("emotions", 80, (1.0, 0.1, 0.01, 0.001)), ("yeast", 60, (0.1, 0.01))])
def test_independent_matches_libsvm(name, n, lams):
    x, y = mulan_subset(name, n)
    for lam in lams:
        W, b = svc_optimum(x, y, lam)
        energy = FinleyJoachimsEnergy(x.shape[1], y.shape[1]).double()
        solver = BCFW(energy, n, lam, tol=1e-3)
        info = solver.fit(x, y, max_epochs=3000, generator=torch.Generator().manual_seed(0))
        assert bool(info.converged) and float(info.relative_gap) <= 1e-3
        p_star = independent_primal(x, y, W, b, lam)
        p_unreg = independent_primal(x, y, energy.unary.weight.detach(), energy.unary.bias.detach(), lam)
        assert p_star * (1 - 1e-6) <= p_unreg <= p_star * 1.005, (lam, float(p_unreg), float(p_star))
        # the certificate: D(mu) lower-bounds the bias-regularised objective at any w (here libsvm's)
        p_rho = independent_primal(x, y, energy.unary.weight.detach(), energy.unary.bias.detach(), lam, 1e-2)
        assert torch.allclose(info.primal, p_rho.reshape(1), rtol=1e-9)
        assert float(info.dual) <= float(independent_primal(x, y, W, b, lam, 1e-2)) + 1e-9


def chain_problem(K: int = 2, n: int = 5, N: int = 60, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, 6, generator=g, dtype=torch.float64)
    y = ((x[:, :n] + 0.5 * x[:, 1:n + 1] + 0.7 * torch.randn(N, n, generator=g, dtype=torch.float64)) > 0).long()
    if K > 2:
        y = y + (x[:, :n] > 1).long()
    return x, y


@pytest.mark.parametrize("energy_kind", ["finley_joachims", "spin", "table3"])
def test_chain_certificate_equals_block_gaps_and_dual_is_monotone(energy_kind):
    K = 3 if energy_kind == "table3" else 2
    x, y = chain_problem(K)
    n, N = y.shape[1], len(x)
    if energy_kind != "table3":
        energy = FinleyJoachimsEnergy(6, n, Graph.chain(n), spin=energy_kind == "spin").double()
    else:
        energy = LinearTableEnergy(6, n, K, Graph.chain(n), input_dependent_pairwise=True).double()
    solver = BCFW(energy, N, 0.5, tol=1e-3)
    gen, duals = torch.Generator().manual_seed(1), []
    for _ in range(5):
        for i in torch.randperm(N, generator=gen).split(16):
            solver.step(x[i], y[i], i)
            duals.append(float(solver.dual()))
    assert all(b >= a - 1e-12 for a, b in zip(duals, duals[1:]))
    idx = torch.arange(N)
    info = solver.duality_gap([(x[:25], y[:25], idx[:25]), (x[25:], y[25:], idx[25:])])
    summed = solver.block_gaps(x, y, idx).sum()
    assert float(info.gap) > 1e-3 and abs(float(info.gap) - float(summed)) <= 1e-9 * float(info.primal)
    assert abs(float(info.dual) - float(solver.dual())) <= 1e-9
    if energy_kind == "finley_joachims":  # plain FW steps on a chain polytope: sublinear, so one energy only
        final = solver.fit(x, y, max_epochs=2000, generator=gen)
        assert bool(final.converged) and float(final.gap) <= 1e-3 * float(final.primal)


def test_blind_step_oracle_escalates_to_the_certificates_oracle():
    """Steps whose oracle only ever proposes the all-zeros labelling converge on that restricted problem, where
    their gap estimate reaches tol; the certificate's exact candidates show the gap they cannot see, so the steps
    take the certificate's oracle and the fit certifies. (Without the escalation the fit ends at max_epochs at
    a relative gap of 0.998.)"""
    x, y = chain_problem()
    n, N = y.shape[1], len(x)

    def all_zeros(pot: Potentials) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        zeros = torch.zeros(pot.unary.shape[:-1], dtype=torch.long)
        return (pot.score(zeros), *one_hot_marginals(zeros, pot.graph, pot.num_states, pot.dtype))

    energy = FinleyJoachimsEnergy(6, n, Graph.chain(n)).double()
    solver = BCFW(energy, N, 0.5, tol=1e-3, oracle=tree_oracle, step_oracle=all_zeros)
    info = solver.fit(x, y, max_epochs=2000, generator=torch.Generator().manual_seed(0))
    assert solver.escalated and solver.step_oracle is tree_oracle
    assert bool(info.converged) and float(info.gap) <= 1e-3 * float(info.primal)
    resumed = BCFW(energy, N, 0.5, tol=1e-3, oracle=tree_oracle, step_oracle=all_zeros)
    resumed.load_state_dict(solver.state_dict())  # a resumed run keeps the escalation
    assert resumed.escalated and resumed.step_oracle is tree_oracle


def test_batched_models_equal_separate_runs():
    """One epoch: the same iterates to rounding; then both certified to 1e-5: the same objectives to 1e-4
    (later iterates need not agree bitwise: free support vectors sit exactly on loss-augmented ties)."""
    x, y = mulan_subset("emotions", 50)
    N, D, n = len(x), x.shape[1], y.shape[1]
    lams = torch.tensor([1.0, 0.3, 0.1, 0.03], dtype=torch.float64)
    fold = torch.arange(N) % 3 != 0  # a CV-style training mask
    mask = torch.stack([torch.ones(N, dtype=torch.bool), fold, ~fold, fold])

    def run(energy, lam, m):
        solver = BCFW(energy, N, lam, tol=1e-5, mask=m)
        for i in torch.randperm(N, generator=torch.Generator().manual_seed(3)).split(16):
            solver.step(x[i], y[i], i)
        first = [p.detach().clone() for p in energy.parameters()]
        return first, solver.fit(x, y, max_epochs=3000, generator=torch.Generator().manual_seed(4))

    batched = FinleyJoachimsEnergy(D, n, num_models=4).double()
    first, info = run(batched, lams, mask)
    assert bool(info.converged.all())
    for m in range(4):
        single = FinleyJoachimsEnergy(D, n).double()
        first_m, ref = run(single, float(lams[m]), mask[m])
        assert all(torch.allclose(a[m], b, atol=1e-10) for a, b in zip(first, first_m))
        assert abs(float(info.primal[m] - ref.primal)) <= 1e-4 * float(ref.primal)
        assert float(info.dual[m]) <= float(ref.primal) and float(ref.dual) <= float(info.primal[m])


def test_masked_model_solves_its_fold():
    x, y = mulan_subset("emotions", 90)
    fold = torch.arange(90) % 3 != 0
    energy = FinleyJoachimsEnergy(x.shape[1], y.shape[1], num_models=2).double()
    solver = BCFW(energy, 90, torch.tensor([0.1, 0.1], dtype=torch.float64), tol=1e-3,
                  mask=torch.stack([fold, ~fold]))
    info = solver.fit(x, y, max_epochs=2000, generator=torch.Generator().manual_seed(0))
    assert bool(info.converged.all())
    for m, rows in enumerate((fold, ~fold)):
        W, b = svc_optimum(x[rows], y[rows], 0.1)
        p_star = independent_primal(x[rows], y[rows], W, b, 0.1)
        p = independent_primal(x[rows], y[rows], energy.unary.weight[m].detach(), energy.unary.bias[m].detach(), 0.1)
        assert p_star * (1 - 1e-6) <= p <= p_star * 1.005


def test_smoothed_oracle_on_loopy_graph_gives_valid_gap():
    x, y = chain_problem()
    energy = FinleyJoachimsEnergy(6, 5, Graph.complete(5)).double()
    solver = BCFW(energy, len(x), 0.1, oracle=smoothed_oracle(eps=0.01, iters=50))
    duals = []
    for i in [i for i in torch.arange(60).split(20) for _ in range(3)]:
        solver.step(x[i], y[i], i)
        duals.append(float(solver.dual()))
    assert all(b >= a - 1e-12 for a, b in zip(duals, duals[1:])) and duals[-1] > 0
    info = solver.duality_gap([(x, y, torch.arange(60))])
    assert float(info.gap) >= 0 and float(info.dual) == pytest.approx(duals[-1], abs=1e-9)


def test_bcfw_averaging_certifies_the_average_against_libsvm():
    """Averaging: the certified point (left in the energy) is the weighted average of the iterates; its gap
    upper-bounds its distance to libsvm's optimum, and it agrees with the plain run's certified objective. (At
    lambda = 0.02 rather than 0.01 the averaged run certifies in about a quarter of the epochs.)"""
    x, y = mulan_subset("emotions", 80)
    for lam in (0.1, 0.02):
        W, b = svc_optimum(x, y, lam)
        runs = {}
        for averaging in (False, True):
            energy = FinleyJoachimsEnergy(x.shape[1], y.shape[1]).double()
            solver = BCFW(energy, 80, lam, tol=1e-3, averaging=averaging)
            info = solver.fit(x, y, max_epochs=3000, generator=torch.Generator().manual_seed(0))
            assert bool(info.converged) and 0 <= float(info.gap) <= 1e-3 * float(info.primal)
            W_hat, b_hat = energy.unary.weight.detach(), energy.unary.bias.detach()
            assert float(info.primal) == pytest.approx(float(independent_primal(x, y, W_hat, b_hat, lam, 1e-2)),
                                                       rel=1e-9)
            p_star_rho = independent_primal(x, y, W, b, lam, 1e-2)  # >= the rho-objective's optimum
            assert float(info.dual) <= float(p_star_rho) + 1e-9
            p_star = independent_primal(x, y, W, b, lam)
            assert p_star * (1 - 1e-6) <= independent_primal(x, y, W_hat, b_hat, lam) <= p_star * 1.005
            runs[averaging] = info
        plain, avg = runs[False], runs[True]
        assert float(avg.dual) <= float(plain.primal) + 1e-12 and float(plain.dual) <= float(avg.primal) + 1e-12


def test_bcfw_averaged_state_is_its_own_dual_point_and_resumes():
    """The averaged dual state rebuilds the averaged weights (so its block gaps sum to P(w_avg) - D(mu_avg),
    at least the certified gap, which may use the iterate's dual); state_dict round-trips mid-run."""
    x, y = chain_problem()
    N, idx = len(x), torch.arange(len(x))

    def solver_and_energy():
        energy = FinleyJoachimsEnergy(6, 5, Graph.chain(5)).double()
        return BCFW(energy, N, 0.5, averaging=True), energy

    def epochs(solver, seed, count):
        gen = torch.Generator().manual_seed(seed)
        for _ in range(count):
            for i in torch.randperm(N, generator=gen).split(16):
                solver.step(x[i], y[i], i)

    solver, energy = solver_and_energy()
    epochs(solver, 0, 3)
    state = {k: v.clone() for k, v in solver.state_dict().items()}
    weights = [p.detach().clone() for p in energy.parameters()]
    own = float(solver.block_gaps(x, y, idx).sum())
    info = solver.duality_gap([(x, y, idx)])
    assert 0 <= float(info.gap) <= own + 1e-12
    assert float(solver.dual()) == pytest.approx(float(info.primal) - own, abs=1e-9)  # D(mu_avg), rebuilt
    assert not torch.allclose(weights[0], state["iterate.0"])  # the energy holds the average, not the iterate
    epochs(solver, 1, 2)
    resumed, resumed_energy = solver_and_energy()
    with torch.no_grad():
        for p, w in zip(resumed_energy.parameters(), weights):
            p.copy_(w)
    resumed.load_state_dict(state)
    epochs(resumed, 1, 2)
    for a, b in zip(energy.parameters(), resumed_energy.parameters()):
        assert torch.allclose(a, b, atol=1e-12)
    assert torch.allclose(solver.avg_pair, resumed.avg_pair, atol=1e-12)
    with pytest.raises(ValueError, match="avg_unary"):
        resumed.load_state_dict({k: v for k, v in state.items() if k != "avg_unary"})


def ensemble_problem(seed: int, N: int = 80, n: int = 7, D: int = 8, trees: int = 4):
    """Labels from a noisy linear rule on D Gaussian features, with an ensemble of random spanning trees."""
    g = torch.Generator().manual_seed(seed)
    x, W = torch.randn(N, D, generator=g, dtype=torch.float64), torch.randn(D, n, generator=g, dtype=torch.float64)
    y = ((x @ W + 0.8 * torch.randn(N, n, generator=g, dtype=torch.float64)) > 0.3).long()
    return x, y, random_spanning_trees(n, trees, g)


def held_as_labellings(solver: BCFW, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mu - sum_j alpha_j m(y_j) (the residual's mass: unary, pairwise) and sum_j alpha_j [M, N] of every example."""
    K = solver.nu_unary.shape[-1]
    Y, A = solver.active_sets.gather(torch.arange(len(y)))
    held_u, held_p = weighted_marginals(Y, pair_index(Y, solver.energy.graph.edges.reshape(-1, 2), K), A, K,
                                        torch.float64)
    m_u, m_p = one_hot_marginals(y, solver.energy.graph, K, torch.float64)
    return m_u - solver.nu_unary.movedim(1, 0) - held_u, m_p - solver.nu_pair.movedim(1, 0) - held_p, A.sum(-1)


@pytest.mark.parametrize("margin", ["hamming", "zero_one"])
def test_pairwise_steps_write_mu_as_their_labellings_and_resume(margin):
    """With 2 slots (labellings evicted often) the dual still rises at every step; every example's point is its
    held labellings plus a residual with no negative mass, and weights sum to at most 1; a state_dict round trip
    mid-run gives the same iterates as the uninterrupted run."""
    x, y, trees = ensemble_problem(0, N=40)
    N = len(x)

    def solver_and_energy():
        energy = TreeEnsembleEnergy(x.shape[1], trees).double()
        return BCFW(energy, N, 0.03, oracle=EnsembleOracle(1, exact=True), margin=margin, active_set=2), energy

    def passes(solver, seed, count, duals):
        gen = torch.Generator().manual_seed(seed)
        for _ in range(count):
            for i in torch.randperm(N, generator=gen).split(8):
                solver.step(x[i], y[i], i)
                duals.append(float(solver.dual()))

    solver, energy = solver_and_energy()
    duals = []
    passes(solver, 0, 20, duals)
    assert all(b >= a - 1e-12 for a, b in zip(duals, duals[1:]))
    residual_u, residual_p, weights = held_as_labellings(solver, y)
    assert float(residual_u.min()) >= -1e-9 and float(residual_p.min()) >= -1e-9
    assert float(weights.max()) <= 1 + 1e-9 and float(weights.min()) > 0 and solver.evictions > 0
    state = {k: v.clone() for k, v in solver.state_dict().items()}
    weights_now = [p.detach().clone() for p in energy.parameters()]
    passes(solver, 1, 3, duals)
    resumed, resumed_energy = solver_and_energy()
    with torch.no_grad():
        for p, w in zip(resumed_energy.parameters(), weights_now):
            p.copy_(w)
    resumed.load_state_dict(state)
    passes(resumed, 1, 3, [])
    for a, b in zip(energy.parameters(), resumed_energy.parameters()):
        assert torch.allclose(a, b, atol=1e-12)
    assert torch.equal(solver.active_sets.weights, resumed.active_sets.weights)


def test_pairwise_steps_certify_where_frank_wolfe_steps_zig_zag():
    """An ensemble of 4 trees, exact searches, relative tol 1e-4: pairwise steps certify within 300 passes; Frank-Wolfe
    steps, after as many passes, are still above 3 times tol (measured: certified after 140 passes, where Frank-Wolfe
    steps stood at 7.1e-4; not certified after 300). Both bound the same optimum: each primal is above the other's
    dual."""
    x, y, trees = ensemble_problem(3, N=30)
    N, full = len(x), [(x, y, torch.arange(len(x)))]

    def fit(active_set: int, max_passes: int) -> tuple[int, GapInfo]:
        energy = TreeEnsembleEnergy(x.shape[1], trees).double()
        solver = BCFW(energy, N, 0.1, oracle=EnsembleOracle(1, exact=True), tol=1e-4, active_set=active_set)
        gen = torch.Generator().manual_seed(1)
        for done in range(1, max_passes + 1):
            for i in torch.randperm(N, generator=gen).split(10):
                solver.step(x[i], y[i], i)
            if done % 10 == 0 or done == max_passes:
                info = solver.duality_gap(full)
                if bool(info.converged.all()):
                    break
        return done, info

    done, pairwise = fit(16, 300)
    assert bool(pairwise.converged.all()), float(pairwise.relative_gap)
    _, frank_wolfe = fit(0, done)
    assert float(frank_wolfe.relative_gap) > 3e-4
    assert float(pairwise.primal) >= float(frank_wolfe.dual) and float(frank_wolfe.primal) >= float(pairwise.dual)


def test_bcfw_bad_input():
    energy = FinleyJoachimsEnergy(3, 2).double()
    with pytest.raises(ValueError, match="lam"):
        BCFW(energy, 10, 0.0)
    with pytest.raises(ValueError, match="lam"):
        BCFW(energy, 10, torch.tensor([0.1, 0.2]))
    with pytest.raises(ValueError, match="mask"):
        BCFW(energy, 10, 0.1, mask=torch.ones(9, dtype=torch.bool))
    with pytest.raises(ValueError, match="steps"):
        BCFW(energy, 10, 0.1, steps="adam")
    with pytest.raises(ValueError, match="averaging"):
        BCFW(energy, 10, 0.1, averaging=1)
    solver = BCFW(energy, 10, 0.1)
    x, y = torch.randn(4, 3, dtype=torch.float64), torch.zeros(4, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="index"):
        solver.step(x, y, torch.arange(3))
    with pytest.raises(ValueError, match="index"):
        solver.step(x, y, torch.tensor([0, 1, 2, 10]))
    with pytest.raises(ValueError, match="y"):
        solver.step(x, y[:3], torch.arange(4))
    with pytest.raises(ValueError, match="all 10 examples"):
        solver.duality_gap([(x, y, torch.arange(4))])
    with pytest.raises(ValueError, match="num_models"):
        FinleyJoachimsEnergy(3, 2, num_models=0)
    with pytest.raises(ValueError, match="active_set"):
        BCFW(energy, 10, 0.1, active_set=-1)
    with pytest.raises(ValueError, match="one block per example"):  # two labels, no edge: two components
        BCFW(energy, 10, 0.1, active_set=4)
    assert BCFW(energy, 10, 0.1, active_set="auto").active_sets is None  # auto: Frank-Wolfe steps there
    x, y = chain_problem()
    loopy = FinleyJoachimsEnergy(6, 5, Graph.complete(5)).double()
    solver = BCFW(loopy, len(x), 0.1, oracle=smoothed_oracle(eps=0.01, iters=20), active_set=4)
    with pytest.raises(ValueError, match="labellings"):
        solver.step(x[:8], y[:8], torch.arange(8))
    solver = BCFW(loopy, len(x), 0.1, oracle=smoothed_oracle(eps=0.01, iters=20), active_set="auto")
    solver.step(x[:8], y[:8], torch.arange(8))  # auto: Frank-Wolfe steps with pseudo-marginals
    assert solver.active_sets is None and solver.active_set == 0


def lbfgs_until(opt: BatchedLBFGS, tol: float, max_iter: int = 500) -> torch.Tensor:
    """Step each model until its gradient norm is <= tol times its initial one; returns converged [M]."""
    return opt.run(max_iter, tol * opt.grad.norm(dim=1))


def test_batched_lbfgs_reaches_scipy_optimum_on_tree_crf():
    x, y = chain_problem()
    energy = FinleyJoachimsEnergy(6, 5, Graph.chain(5)).double()
    params = list(energy.parameters())
    lam = 0.05

    def objective():
        return crf_nll(energy(x), y).mean() + lam / 2 * sum(p.pow(2).sum() for p in params)

    opt = BatchedLBFGS(params, objective)
    assert bool(lbfgs_until(opt, 1e-7).all())
    shapes = [p.shape for p in params]

    def f(theta):
        with torch.no_grad():
            chunks = torch.from_numpy(theta).split([s.numel() for s in shapes])
            for p, c in zip(params, chunks):
                p.copy_(c.view(p.shape))
            return float(objective())

    ours = float(opt.value)
    ref = minimize(f, np.zeros(sum(s.numel() for s in shapes)), method="L-BFGS-B",
                   options={"maxiter": 5000, "ftol": 1e-15, "gtol": 1e-12}).fun
    assert abs(ours - ref) <= 1e-6 * abs(ref) and ours <= ref + 1e-12


def test_batched_lbfgs_per_model_steps_and_bad_input():
    x, y = chain_problem()
    energy = FinleyJoachimsEnergy(6, 5, Graph.chain(5), num_models=2).double()
    lam = torch.tensor([0.5, 0.05], dtype=torch.float64)
    params = list(energy.parameters())

    def objective():
        sq = sum(p.pow(2).flatten(1).sum(1) for p in params)
        return crf_nll(energy(x), y).mean(-1) + lam / 2 * sq

    opt = BatchedLBFGS(params, objective, num_models=2)
    before = [p.detach()[0].clone() for p in params]
    opt.step(torch.tensor([False, True]))  # model 0 does not move
    assert all(torch.equal(p[0], b) for p, b in zip(params, before))
    assert bool(lbfgs_until(opt, 1e-6).all())
    for m in range(2):  # each model at its own optimum: scipy on model m alone
        single = FinleyJoachimsEnergy(6, 5, Graph.chain(5)).double()
        single_params = list(single.parameters())

        def single_objective(m=m, single=single, single_params=single_params):
            return crf_nll(single(x), y).mean() + float(lam[m]) / 2 * sum(p.pow(2).sum() for p in single_params)

        ref = BatchedLBFGS(single_params, single_objective)
        lbfgs_until(ref, 1e-8)
        assert float(opt.value[m]) == pytest.approx(float(ref.value), rel=1e-9)
    with pytest.raises(ValueError, match="num_models"):
        BatchedLBFGS(params, objective, num_models=3)
    with pytest.raises(ValueError, match="history_size"):
        BatchedLBFGS(params, objective, num_models=2, history_size=0)
    with pytest.raises(TypeError, match="params"):
        BatchedLBFGS([], objective)


def test_batched_lbfgs_keeps_a_block_step_made_outside_it_as_a_curvature_pair():
    """``refresh(start)``: parameters moved from ``start`` by a step outside the optimizer (a solver's block step on
    the same objective) give one more curvature pair, s = the move and y = A s on a quadratic 1/2 x^T A x - b^T x, for
    the models that moved (model 1 did not: no pair); a plain ``refresh()`` adds none."""
    g = torch.Generator().manual_seed(0)
    root = torch.randn(3, 3, generator=g, dtype=torch.float64)
    A, b = root @ root.T + torch.eye(3, dtype=torch.float64), torch.randn(2, 3, generator=g, dtype=torch.float64)
    x = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    opt = BatchedLBFGS([x], lambda: 0.5 * ((x @ A) * x).sum(1) - (b * x).sum(1), num_models=2)
    opt.step()
    opt.refresh()
    assert len(opt.S) == 1
    start, move = x.detach().clone(), torch.tensor([[0.3, -0.2, 0.1], [0.0, 0.0, 0.0]], dtype=torch.float64)
    with torch.no_grad():
        x += move
    opt.refresh(start)
    assert len(opt.S) == 2 and torch.allclose(opt.S[-1], move) and torch.allclose(opt.Y[-1], move @ A)
    assert float(opt.rho[-1][0]) == pytest.approx(1 / float(move[0] @ A @ move[0])) and float(opt.rho[-1][1]) == 0.0


# ---------------------------------------------------------------------- smoothed L-BFGS
def brute_force_hinge(energy, x, y, margin=1.0):
    """Hamming-rescaled hinge [M, N] by enumerating every labelling (small n)."""
    pot = energy(x)
    n, K = y.shape[1], pot.num_states
    labellings = torch.cartesian_prod(*[torch.arange(K)] * n).reshape(-1, n)  # [K^n, n]
    scores = torch.stack([pot.score(yy.expand(len(x), n)) for yy in labellings], -1)  # [(M,) N, K^n]
    hamming = (labellings[None] != y[:, None]).sum(-1).to(scores.dtype)  # [N, K^n]
    return (scores + margin * hamming).amax(-1) - pot.score(y)


def primal_rho(energy, x, y, lam, rho, hinge):
    sq = sum((p.pow(2) * (rho if n.endswith("bias") else 1.0)).sum() for n, p in energy.named_parameters())
    return lam / 2 * sq + hinge.mean()


@pytest.mark.parametrize("name,n,lams", [("emotions", 391, (1.0, 0.1, 0.01, 0.001)), ("yeast", 300, (1.0, 0.1, 0.01))])
def test_smoothed_lbfgs_matches_libsvm(name, n, lams):
    """Whole emotions training file (a small subset is nearly separable at lambda = 0.001: many support vectors
    exactly on the margin, where the smoothed solve needs far more iterations)."""
    x, y = mulan_subset(name, n)
    for lam in lams:
        W, b = svc_optimum(x, y, lam)
        energy = FinleyJoachimsEnergy(x.shape[1], y.shape[1]).double()
        info = SmoothedLBFGS(energy, x, y, lam, tol=1e-3).fit(max_iter=20000)
        assert bool(info.converged) and 0 <= float(info.gap) <= 1e-3 * float(info.primal)
        p_star = independent_primal(x, y, W, b, lam)
        p = independent_primal(x, y, energy.unary.weight.detach(), energy.unary.bias.detach(), lam)
        assert p_star * (1 - 1e-6) <= p <= p_star * 1.005, (lam, float(p), float(p_star))
        # the certificate's primal is the exact bias-regularised objective; its dual bounds libsvm's point too
        assert float(info.primal) == pytest.approx(float(independent_primal(
            x, y, energy.unary.weight.detach(), energy.unary.bias.detach(), lam, 1e-4)), rel=1e-9)
        assert float(info.dual) <= float(independent_primal(x, y, W, b, lam, 1e-4)) + 1e-9


@pytest.mark.parametrize("energy_kind", ["finley_joachims", "table3"])
def test_smoothed_lbfgs_certificate_on_a_tree_against_enumeration(energy_kind):
    """The primal is the brute-force hinge objective; the dual lower-bounds it at any other parameters."""
    K = 2 if energy_kind == "finley_joachims" else 3
    x, y = chain_problem(K, n=4, N=40)
    n = y.shape[1]
    graph = Graph.star(n)
    if energy_kind == "finley_joachims":
        energy = FinleyJoachimsEnergy(6, n, graph).double()
    else:
        energy = LinearTableEnergy(6, n, K, graph, input_dependent_pairwise=True).double()
    solver = SmoothedLBFGS(energy, x, y, 0.3, tol=1e-4)
    solver.run(3)
    early = solver.certify()
    with torch.no_grad():
        assert float(early.primal) == pytest.approx(float(primal_rho(
            energy, x, y, 0.3, 1e-4, brute_force_hinge(energy, x, y))), rel=1e-9)
    info = solver.fit(max_iter=5000)
    assert bool(info.converged) and float(info.gap) <= 1e-4 * float(info.primal)
    with torch.no_grad():
        for seed in range(3):
            for p in energy.parameters():
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed), dtype=p.dtype) * 0.3)
            other = primal_rho(energy, x, y, 0.3, 1e-4, brute_force_hinge(energy, x, y))
            assert float(info.dual) <= float(other) + 1e-12


def rare_labels_problem(N: int = 200, D: int = 8, n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """x [N, D], y [N, n] with labels from common (about half the rows) to rare (1 positive of 200)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=g, dtype=torch.float64)
    offset = torch.tensor([0.0, 0.0, 1.0, 2.0, 3.0, 3.5])[:n].double()
    return x, (x[:, :n] + 0.5 * torch.randn(N, n, generator=g, dtype=torch.float64) - offset > 0).long()


def chain_crf(num_models: int | None = None) -> LocalLinearEnergy:
    """A CRF (``LocalLinearEnergy``, float64) of ``rare_labels_problem``'s 8 inputs on a chain of its 6 labels, label i
    reading inputs i and i + 1."""
    energy = LocalLinearEnergy(8, 6, num_inputs=2, graph=Graph.chain(6), num_models=num_models).double()
    energy.set_inputs([[i, i + 1] for i in range(6)])
    return energy


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 2), st.integers(1, 30), st.integers(1, 5), st.floats(1e-7, 1.0), st.floats(0.01, 2.0),
       st.floats(0.0, 0.3), st.integers(0, 2**31 - 1))
@example(1, 29, 3, 1e-7, 0.5, 0.1875, 82022843)  # 60 steps left a residual of 5.9e-11 (bisection over 4e7)
@example(1, 1, 2, 0.0625, 1.0, 0.0, 0)  # saturated: Newton from either end lands on the other (a closed bracket cycled)
def test_label_bias_shift_zeroes_each_labels_bias_gradient(M, N, n, curvature, eps, saturated, seed):
    """The shift d solves c (b + d) + sum_i w_i (sigma(z_i + d / eps) - y_i) = 0 for every label, also where
    marginals are exactly 0 or 1 (infinite logits) and where the regulariser's curvature is tiny (rare labels at
    bias_reg 1e-4); checked against the equation in numpy."""
    g = torch.Generator().manual_seed(seed)
    z = 4 * torch.randn(M, N, n, generator=g, dtype=torch.float64)
    cut = torch.rand(M, N, n, generator=g) < saturated
    z[cut] = torch.where(torch.rand(int(cut.sum()), generator=g) < 0.5, -torch.inf, torch.inf).double()
    y = (torch.rand(N, n, generator=g) < 0.3).long()
    mask = torch.rand(M, N, generator=g) < 0.8
    mask[:, 0] = True
    weight = mask.double() / mask.sum(1, keepdim=True)
    b = torch.randn(M, n, generator=g, dtype=torch.float64)
    c, e = torch.full((M,), curvature, dtype=torch.float64), torch.full((M,), eps, dtype=torch.float64)
    d = label_bias_shift(z.float(), y, weight, b, c, e).numpy()
    s = 1 / (1 + np.exp(-(z.float().double().numpy() + d[:, None, :] / eps)))
    residual = curvature * (b.numpy() + d) + ((s - y.numpy()) * weight.numpy()[..., None]).sum(1)
    assert np.abs(residual).max() <= 1e-12, residual


def test_label_bias_shift_converges_in_few_newton_steps():
    """Rare labels at curvature 1e-6: Newton's quadratic convergence ends within 10 steps (residual 5e-16). A root
    reached to within d's rounding must stay: before it did, its step landed on the bracket's end (outside the open
    bracket) and went to bisection, so that 10 steps left a residual of 0.27, 40 steps 4e-6 (a certificate on
    delicious' CV rows then spent 75 steps, 17 s, in it)."""
    g = torch.Generator().manual_seed(0)
    z = (-4 + 2 * torch.randn(2, 300, 40, generator=g)).float()
    y = (torch.rand(300, 40, generator=g) < 0.02).long()
    weight = torch.full((2, 300), 1 / 300, dtype=torch.float64)
    b = -4 + torch.randn(2, 40, generator=g, dtype=torch.float64)
    curvature, eps = torch.full((2,), 1e-6, dtype=torch.float64), torch.ones(2, dtype=torch.float64)
    d = label_bias_shift(z, y, weight, b, curvature, eps, iters=10)
    s = torch.sigmoid(z.double() + d[:, None, :])
    residual = curvature[:, None] * (b + d) + ((s - y.double()) * weight[..., None]).sum(1)
    assert float(residual.abs().max()) <= 1e-12, residual


@pytest.mark.parametrize("crf", [False, True])
def test_moved_biases_zero_the_bias_gradient_of_independent_labels(monkeypatch, crf):
    """On an edgeless graph the labels are independent, so the shifts, each exact for its own label, are exact
    together: at the moved biases the smoothed objective's gradient w.r.t. the biases is zero (to the float32
    logits' rounding), and that dual point is above the iterate's; ``moved_biases`` leaves the iterate where it
    was. For the M3N's hinge (FinleyJoachims' spin biases) and a CRF's likelihood (LocalLinear's state-1 biases)."""
    x, y = rare_labels_problem()
    empty = Graph(6, torch.zeros(0, 2, dtype=torch.long))
    if crf:
        energy = LocalLinearEnergy(8, 6, num_inputs=2, graph=empty).double()
        solver = SmoothedLBFGS(energy, x, y, 0.01, margin_scale=0.0, eps=1.0)
        param, entry = energy.unary_bias, (..., 1)
    else:
        energy = FinleyJoachimsEnergy(8, 6, empty).double()
        solver = SmoothedLBFGS(energy, x, y, 0.01)
        param, entry = energy.unary.bias, (...,)
    solver.run(5)
    _, point, _, logits, _ = solver._gap(keep_logits=True)
    bias = energy.label_bias()
    before, grads, gap = bias.detach().clone(), [], solver._gap
    grads.append(torch.autograd.grad(solver.objective(), param)[0][entry])

    def spy(*args, **kwargs):  # moved_biases evaluates its point here, at the moved biases
        grads.append(torch.autograd.grad(solver.objective(), param)[0][entry])
        return gap(*args, **kwargs)

    monkeypatch.setattr(solver, "_gap", spy)
    _, (moved,) = solver.moved_biases(bias, logits)  # without a bound: the labels' point alone
    assert torch.equal(bias.detach(), before)
    assert float(solver.dual_value(moved)) > float(solver.dual_value(point))
    grad, moved_grad = grads
    assert float(grad.abs().max()) > 1e-3 and float(moved_grad.abs().max()) < 1e-8, (grad, moved_grad)


def test_a_tree_crf_certificate_moves_its_biases_where_that_lowers_its_objective(monkeypatch):
    """A tree CRF (``LocalLinearEnergy``, binary labels, a fixed eps: the objective L-BFGS minimises is the primal) has
    a ``label_bias``: a certificate moves the labels' biases to zero their gradients, each label alone (the edges
    couple them, so it is not the biases' optimum), then the edges' biases, and keeps the lower point where the
    objective falls there: a block step. After 5 iterations from 0 it does (1.0314 -> 1.0268 here), the largest bias
    gradient falls 10x, and D <= P still; with ``BIAS_MOVE_ELEMENTS`` = 0 the same iterate stays where it was."""
    from structtorch.solvers import smoothing

    x, y = rare_labels_problem()
    runs = []
    for limit in (smoothing.BIAS_MOVE_ELEMENTS, 0):
        monkeypatch.setattr(smoothing, "BIAS_MOVE_ELEMENTS", limit)
        energy = chain_crf()
        solver = SmoothedLBFGS(energy, x, y, 0.01, margin_scale=0.0, eps=1.0, tol=1e-3)
        solver.run(5)
        before = solver.opt.slices.flat().clone()
        info = solver.certify()
        assert float(info.dual) <= float(info.primal)
        grad = torch.autograd.grad(solver.objective(), energy.unary_bias)[0][..., 1]
        runs.append((before, solver.opt.slices.flat(), float(info.primal), float(grad.abs().max()), solver.moved))
    (start, moved, primal, grad, flagged), (start_alone, stayed, primal_alone, grad_alone, flagged_alone) = runs
    assert torch.equal(start, start_alone) and torch.equal(start_alone, stayed) and not flagged_alone
    assert not torch.equal(moved, start) and flagged
    assert primal < primal_alone - 1e-3 * primal_alone, (primal, primal_alone)
    assert grad < 0.2 * grad_alone, (grad, grad_alone)


def test_moved_biases_keep_the_move_only_where_the_primal_falls_below_the_bound():
    """``moved_biases(bias, logits, below)``: of two CRF models (one fit, ``num_models`` = 2), the one whose bound is
    -inf keeps its biases, the one whose bound is +inf takes the lower of the two moved points (the labels' biases,
    then the edges' too); the input weights stay."""
    x, y = rare_labels_problem()
    energy = chain_crf(num_models=2)
    solver = SmoothedLBFGS(energy, x, y, 0.01, margin_scale=0.0, eps=1.0)
    solver.run(10)
    logits = solver._gap(keep_logits=True)[3]
    bias, before = energy.label_bias(), [p.detach().clone() for p in energy.parameters()]
    start = bias.detach().clone()
    primal, points = solver.moved_biases(bias, logits, torch.tensor([-torch.inf, torch.inf], dtype=torch.float64))
    assert primal.shape == (2,) and solver.moved and len(points) == 2
    assert torch.equal(bias[0], start[0]) and not torch.equal(bias[1], start[1])
    changed = [[not torch.equal(p[m], q[m]) for p, q in zip(energy.parameters(), before)] for m in (0, 1)]
    assert changed == [[False] * 4, [name.endswith("bias") for name, _ in energy.named_parameters()]], changed


@pytest.mark.parametrize("at_pass", [1, 2])
def test_moved_biases_put_the_biases_back_when_their_pass_is_interrupted(monkeypatch, at_pass):
    """An exception within a moved point's pass (Ctrl-C, a negative gap), the labels' (1) or the edges' (2), leaves
    both kinds of biases where they were."""
    x, y = rare_labels_problem()
    energy = chain_crf()
    solver = SmoothedLBFGS(energy, x, y, 0.01, margin_scale=0.0, eps=1.0)
    solver.run(5)
    logits = solver._gap(keep_logits=True)[3]
    bias, table = energy.label_bias(), energy.edge_bias()
    start, start_table, gap, passes = bias.detach().clone(), table.detach().clone(), solver._gap, []

    def interrupted(*args, **kwargs):
        passes.append(1)
        assert not torch.equal(bias, start)  # the pass runs at the moved biases
        assert torch.equal(table, start_table) == (len(passes) == 1)
        if len(passes) == at_pass:
            raise KeyboardInterrupt
        return gap(*args, **kwargs)

    monkeypatch.setattr(solver, "_gap", interrupted)
    with pytest.raises(KeyboardInterrupt):
        solver.moved_biases(bias, logits, torch.tensor([torch.inf], dtype=torch.float64))
    assert torch.equal(bias, start) and torch.equal(table, start_table) and not solver.moved


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 2), st.integers(1, 30), st.integers(1, 4), st.sampled_from([2, 3]), st.floats(1e-7, 1.0),
       st.floats(0.25, 2.0), st.floats(0.0, 0.3), st.integers(0, 2**31 - 1))
def test_pair_bias_shift_zeroes_each_edges_bias_gradient(M, N, E, K, curvature, eps, zeros, seed):
    """The shift d solves c (b + d) + sum_i w_i (softmax(l_i + d / eps) - onehot(state_i)) = 0 for every edge's
    table, also where some pairwise marginals are exactly 0 (log -inf: entries other than the rows' own states, whose
    roots are then set by the regulariser alone) and where the regulariser's curvature is tiny (bias_reg 1e-4);
    checked against the equation in numpy."""
    g = torch.Generator().manual_seed(seed)
    Q = K * K
    logits = 3 * torch.randn(M, N, E, Q, generator=g, dtype=torch.float64)
    state = torch.randint(0, Q, (N, E), generator=g)
    own = torch.nn.functional.one_hot(state, Q).bool().expand(M, N, E, Q)
    logits[(torch.rand(M, N, E, Q, generator=g) < zeros) & ~own] = -torch.inf
    log_mu = torch.log_softmax(logits, -1).float()
    mask = torch.rand(M, N, generator=g) < 0.8
    mask[:, 0] = True
    weight = mask.double() / mask.sum(1, keepdim=True)
    b = torch.randn(M, E, Q, generator=g, dtype=torch.float64)
    c, e = torch.full((M,), curvature, dtype=torch.float64), torch.full((M,), eps, dtype=torch.float64)
    d = pair_bias_shift(log_mu, state, weight, b, c, e, iters=60).numpy()
    z = log_mu.double().numpy() + d[:, None] / eps
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    onehot = np.eye(Q)[state.numpy()]
    residual = curvature * (b.numpy() + d) + (weight.numpy()[..., None, None] * (p - onehot)).sum(1)
    assert np.abs(residual).max() <= 1e-9, np.abs(residual).max()


def test_an_edges_moved_bias_zeroes_its_gradient_in_the_crf_objective():
    """Adding an edge's shift to its table alone reweights the distribution by a function of that edge's two labels,
    so the shift is exact for that edge in the CRF itself: on a tree CRF whose only edge is (0, 1), the objective's
    gradient w.r.t. that table is zero after the move (to the float32 log-marginals' rounding), and was not before."""
    x, y = rare_labels_problem()
    energy = LocalLinearEnergy(8, 6, num_inputs=2, graph=Graph(6, torch.tensor([[0, 1]]))).double()
    energy.set_inputs([[i, i + 1] for i in range(6)])
    solver = SmoothedLBFGS(energy, x, y, 0.01, margin_scale=0.0, eps=1.0)
    solver.run(5)
    pairs = solver._gap(keep_pairs=True)[4]
    table = energy.pair_bias
    states = solver._edge_states(slice(None))
    grad = torch.autograd.grad(solver.objective(), table)[0]
    curvature = solver.lam * solver._reg_weight[solver._index(table)]  # lambda bias_reg
    shift = pair_bias_shift(pairs, states, solver._weight(), table.detach().reshape(1, 1, 4), curvature, solver.eps)
    with torch.no_grad():
        table += shift.reshape(table.shape)
    moved_grad = torch.autograd.grad(solver.objective(), table)[0]
    assert float(grad.abs().max()) > 1e-3 and float(moved_grad.abs().max()) < 1e-6, (grad, moved_grad)


def test_a_crfs_block_steps_on_the_edges_biases_certify_in_fewer_iterations(monkeypatch):
    """The certificates' block steps of a chain CRF with rare labels: the labels' biases moved, then the edges' biases,
    the lower point taken where the objective falls. With the edges' move the fit certifies at tol 1e-4 in at most
    half the iterations it takes with the labels' alone (60 against 140 here; ``PAIR_MOVE_ELEMENTS`` = 0), to the
    same objective within the tolerance."""
    from structtorch.solvers import smoothing

    x, y = rare_labels_problem()
    runs = []
    for limit in (smoothing.PAIR_MOVE_ELEMENTS, 0):
        monkeypatch.setattr(smoothing, "PAIR_MOVE_ELEMENTS", limit)
        solver = SmoothedLBFGS(chain_crf(), x, y, 0.01, margin_scale=0.0, eps=1.0, tol=1e-4)
        info = solver.fit(max_iter=2000)
        assert bool(info.converged.all())
        runs.append((solver.iterations, float(info.primal)))
    (iterations, primal), (alone, primal_alone) = runs
    assert iterations <= 0.5 * alone, (iterations, alone)
    assert abs(primal - primal_alone) <= 1e-4 * primal_alone


def test_moved_biases_lift_the_dual_without_moving_the_iterate(monkeypatch):
    """With rare labels and bias_reg 1e-4 the dual lags on the biases; each certificate's second dual point, at the
    biases moved to zero their gradient, lifts it: after the same 140 iterations, certified every 20 (the same
    iterates: that point does not move them, and the temperature follows the iterates' own gaps), the gap is several
    times smaller (1.6e-3 against 1.4e-2 relative here), and the fit certifies in fewer iterations (320 against 440).
    Turned off (``BIAS_MOVE_ELEMENTS`` = 0), the dual is the iterates' alone."""
    from structtorch.solvers import smoothing

    x, y = rare_labels_problem()
    runs = []
    for limit in (smoothing.BIAS_MOVE_ELEMENTS, 0):
        monkeypatch.setattr(smoothing, "BIAS_MOVE_ELEMENTS", limit)
        solver = SmoothedLBFGS(FinleyJoachimsEnergy(8, 6, Graph.chain(6)).double(), x, y, 0.01, tol=1e-4)
        solver.certify()
        for _ in range(7):
            solver.run(20)
            info = solver.certify()
        fit = SmoothedLBFGS(FinleyJoachimsEnergy(8, 6, Graph.chain(6)).double(), x, y, 0.01, tol=1e-4)
        runs.append((info, solver.opt.slices.flat(), bool(fit.fit(max_iter=5000).converged), fit.iterations))
    (moved, at, certified, iterations), (alone, at_alone, certified_alone, iterations_alone) = runs
    assert torch.equal(at, at_alone) and torch.equal(moved.primal, alone.primal)
    assert float(alone.dual) < float(moved.dual) <= float(moved.primal)
    assert float(moved.gap) < 0.25 * float(alone.gap), (float(moved.gap), float(alone.gap))
    assert certified and certified_alone and iterations < 0.8 * iterations_alone, (iterations, iterations_alone)


def test_a_tree_crf_without_edges_is_certified():
    """``LocalLinearEnergy`` on an edgeless graph (a forest of single labels: independent logistic regressions) has
    empty pairwise tables, and its CRF fit certifies (the batched matmul over no edges had failed to infer its
    width)."""
    x, y = rare_labels_problem()
    energy = LocalLinearEnergy(8, 6, num_inputs=2, graph=Graph(6, torch.zeros(0, 2, dtype=torch.long))).double()
    assert energy(x).pairwise.shape == (200, 0, 2, 2)
    assert bool(SmoothedLBFGS(energy, x, y, 0.01, margin_scale=0.0, eps=1.0).fit().converged)


def test_smoothed_lbfgs_puts_back_its_best_certified_point():
    """restore_best: a model whose parameters ended worse than at an earlier certificate (here thrown far off after
    it) gets that certificate's parameters back, certified against the highest dual seen; a model whose last point
    is its best keeps it; the optimizer goes on from there."""
    x, y = chain_problem(2, n=4, N=40)
    energy = FinleyJoachimsEnergy(6, 4, Graph.chain(4), num_models=2).double()
    solver = SmoothedLBFGS(energy, x, y, torch.tensor([0.3, 0.3], dtype=torch.float64), tol=1e-9)
    solver.run(5)
    good = solver.certify()
    kept = [p.detach().clone() for p in energy.parameters()]
    with torch.no_grad():
        for p in energy.parameters():
            p[1] += 3.0
    thrown = solver.certify()
    assert float(thrown.primal[1]) > float(good.primal[1]) and float(thrown.primal[0]) == float(good.primal[0])
    info = solver.restore_best()
    for p, q in zip(energy.parameters(), kept):
        assert torch.equal(p.detach(), q)
    assert torch.equal(info.primal, good.primal) and bool((info.dual >= torch.maximum(good.dual, thrown.dual)).all())
    solver.run(5)
    assert bool((solver.certify().primal < good.primal).all())


def test_smoothed_lbfgs_keeps_the_curvature_pairs_that_fit_in_memory(monkeypatch):
    """L-BFGS keeps at most ``history_size`` curvature pairs, fewer (at least 1) where ``HISTORY_MEMORY_SHARE`` of the
    memory available holds fewer: MAM at rcv1subset's shape (284M float64 parameters) was killed by the operating
    system with 20. The pairs dropped are the oldest, and the fit still certifies."""
    from structtorch.solvers import smoothing

    x, y = chain_problem(2, n=4, N=40)
    energy = FinleyJoachimsEnergy(6, 4, Graph.chain(4)).double()
    pair = 2 * 8 * sum(p.numel() for p in energy.parameters())
    monkeypatch.setattr(smoothing, "available_memory", lambda device: None)
    assert SmoothedLBFGS(energy, x, y, 0.3).opt.history_size == 20  # unknown memory: as asked
    share = smoothing.HISTORY_MEMORY_SHARE
    for pairs, kept in ((0.5, 1), (4.5, 4), (10**6, 20)):
        monkeypatch.setattr(smoothing, "available_memory", lambda device, free=pairs * pair / share: free)
        assert smoothing.history_that_fits(list(energy.parameters()), 20) == kept
    monkeypatch.setattr(smoothing, "available_memory", lambda device: 2.5 * pair / share)
    solver = SmoothedLBFGS(energy, x, y, 0.3, tol=1e-6)
    assert solver.opt.history_size == 2
    lengths = []
    for _ in range(6):
        solver.run(1)
        lengths.append(len(solver.opt.S))
    assert lengths == [1, 2, 2, 2, 2, 2] and bool(solver.fit(max_iter=5000).converged)


class LiveElements(TorchDispatchMode):
    """Counts the elements of the live tensors of at least ``floor`` elements that ops allocate while it is on
    (not views or in-place results: outputs sharing an input's storage), and their peak."""

    def __init__(self, floor: int) -> None:
        super().__init__()
        self.floor, self.live, self.peak = floor, 0, 0

    def _freed(self, count: int) -> None:
        self.live -= count

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.numel() >= self.floor and t.untyped_storage().data_ptr() not in inputs:
                self.live += t.numel()
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._freed, t.numel())
        return out


@pytest.mark.parametrize("bias", [False, True])
def test_smoothed_lbfgs_holds_few_parameter_sized_tensors(bias):
    """MAM at rcv1subset's shape has 284M parameters: every parameter-sized tensor is 1.1 GB (float32), so what an
    L-BFGS iteration and a certificate allocate decides whether it fits in memory. Beyond the parameters, the best
    point and the mixed dual point, an iteration holds the h curvature pairs (2 h), the gradient, the step's start
    and its direction (3), and while a trial point is evaluated its gradient buffer and one term's gradients (2):
    2 h + 5 parameters' worth at its peak; a certificate keeps no dual point beside the mixed one (2 h + 1 live
    after it), and alone peaks at 2.25, or 3 with an energy's ``label_bias`` (its second dual point is made once the
    first is mixed in and freed: 4 when both were held). Seen before: 2 h + 9.5 to 10.5 (the line search's trial
    points, the direction's products, the dual points' mixing); then 2 h + 5.25, or 2 h + 6.25 when a line search
    backtracked (vector_norm's backward made two temporaries, the regulariser's gradient and the data term's were
    made at once, a failed trial's gradient was held while the next was made)."""
    g = torch.Generator().manual_seed(0)
    n, D, h = 6, 3000, 2
    x = torch.randn(20, D, generator=g, dtype=torch.float64)  # the parameters (6 D or 32 D) dwarf every other tensor
    energy = (FinleyJoachimsEnergy(D, n, Graph.chain(n)) if bias else
              LinearTableEnergy(D, n, 2, Graph.chain(n), input_dependent_pairwise=True)).double()
    P = sum(p.numel() for p in energy.parameters())
    solver = SmoothedLBFGS(energy, x, (x[:, :n] > 0).long(), 0.1, history_size=h)
    solver.run(3)
    solver.certify()  # the best point and the mixed dual point exist
    with LiveElements(D) as mode:
        for _ in range(2):
            solver.run(2)
            solver.certify()
    assert mode.peak / P <= 2 * h + 5.1 and mode.live / P <= 2 * h + 1.1, (mode.peak / P, mode.live / P)
    with LiveElements(D) as mode:
        solver.certify()
    assert mode.peak / P <= (3.1 if bias else 2.3), mode.peak / P  # 4.0 with both dual points held at once


def test_squared_rows_gradient():
    """The regulariser's |t_m|^2 per row and its one-temporary backward, against finite differences."""
    rows = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    assert torch.allclose(SquaredRows.apply(rows), (rows * rows).sum(1))
    assert torch.autograd.gradcheck(SquaredRows.apply, (rows,))


def test_backtracking_frees_a_failed_trial_before_the_next():
    """A failed trial's value and gradient (a parameter-sized tensor) are freed before the next trial is made."""
    live, trials = [], []

    def evaluate(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        live.append(len(trials) - sum(ref() is None for ref in trials))  # earlier trials' gradients still held
        grad = torch.zeros(1000)
        trials.append(weakref.ref(grad))
        return (t - 0.25).abs(), grad

    t, (f, _) = backtrack(evaluate, torch.tensor([0.25]), torch.tensor([-1.0]), torch.tensor([1.0]))
    assert float(t) == 0.25 and live == [0, 0, 0]  # trials at 1, 0.5, 0.25


def test_an_uncertified_fit_ends_on_its_lowest_primal_against_the_best_mix_of_its_duals(monkeypatch):
    """Every certificate's marginals are a dual point, and so is any convex combination of them (D is concave), so a
    fit stopped before its tolerance reports the lowest primal it certified, at those parameters, against the best
    combination of its certificates' dual points (``mix_dual``): at least the highest single dual, here above it,
    and still below the optimum (never a negative gap)."""
    from structtorch.solvers.smoothing import SmoothedHinge

    seen, original = [], SmoothedHinge._gap

    def recorded(self, **kwargs):
        out = original(self, **kwargs)
        seen.append(out[0])
        return out

    monkeypatch.setattr(SmoothedHinge, "_gap", recorded)
    x, y = chain_problem(3, n=5, N=60)
    energy = LinearTableEnergy(6, 5, 3, Graph.chain(5), input_dependent_pairwise=True).double()
    info = SmoothedLBFGS(energy, x, y, 0.01, tol=1e-12).fit(max_iter=60, check_every=4)
    primals, duals = [float(s.primal) for s in seen], [float(s.dual) for s in seen]
    assert not bool(info.converged) and float(info.primal) == min(primals)
    assert float(info.dual) > max(duals) + 1e-3 * (min(primals) - max(duals)), (float(info.dual), max(duals))
    assert float(SmoothedLBFGS(energy, x, y, 0.01).certify().primal) == pytest.approx(min(primals), rel=1e-12)
    optimum = SmoothedLBFGS(energy, x, y, 0.01, tol=1e-4).fit(max_iter=20000)
    assert bool(optimum.converged) and float(info.dual) <= float(optimum.primal) * (1 + 1e-9)
    assert duals.index(max(duals)) < len(duals) - 1  # here the last dual is not the highest (a lower temperature)


def test_smoothed_lbfgs_batched_folds_equal_separate_runs():
    x, y = mulan_subset("emotions", 90)
    fold = torch.arange(90) % 3 != 0
    mask = torch.stack([torch.ones(90, dtype=torch.bool), fold, ~fold])
    lams = torch.tensor([0.1, 0.3, 1.0], dtype=torch.float64)
    energy = FinleyJoachimsEnergy(x.shape[1], y.shape[1], num_models=3).double()
    info = SmoothedLBFGS(energy, x, y, lams, mask=mask, tol=1e-3).fit(max_iter=20000)
    assert info.converged.shape == (3,) and bool(info.converged.all())
    for m in range(3):
        rows = mask[m]
        W, b = svc_optimum(x[rows], y[rows], float(lams[m]))
        p_star = independent_primal(x[rows], y[rows], W, b, float(lams[m]))
        p = independent_primal(x[rows], y[rows], energy.unary.weight[m].detach(), energy.unary.bias[m].detach(),
                               float(lams[m]))
        assert p_star * (1 - 1e-6) <= p <= p_star * 1.005, (m, float(p), float(p_star))


def test_smoothed_lbfgs_crf_reaches_scipy_optimum_with_a_certificate():
    """eps=1, margin 0: the CRF likelihood (+ bias-regularised l2); certified against its entropy dual."""
    x, y = chain_problem()
    energy = FinleyJoachimsEnergy(6, 5, Graph.chain(5)).double()
    lam, rho = 0.05, 1e-4
    info = SmoothedLBFGS(energy, x, y, lam, margin_scale=0.0, eps=1.0, bias_reg=rho, tol=1e-8).fit(max_iter=2000)
    assert bool(info.converged)
    named = list(energy.named_parameters())

    def f(theta):
        with torch.no_grad():
            for (_, p), c in zip(named, torch.from_numpy(theta).split([p.numel() for _, p in named])):
                p.copy_(c.view(p.shape))
            sq = sum((p.pow(2) * (rho if name.endswith("bias") else 1.0)).sum() for name, p in named)
            return float(crf_nll(energy(x), y).mean() + lam / 2 * sq)

    ref = minimize(f, np.zeros(sum(p.numel() for _, p in named)), method="L-BFGS-B",
                   options={"maxiter": 5000, "ftol": 1e-15, "gtol": 1e-12}).fun
    assert float(info.dual) <= ref + 1e-9 and abs(float(info.primal) - ref) <= 1e-7 * abs(ref)


def test_smoothed_lbfgs_on_a_loopy_graph_certifies_the_lp_relaxed_objective():
    x, y = chain_problem(n=4, N=30)
    energy = FinleyJoachimsEnergy(6, 4, Graph.complete(4)).double()
    info = SmoothedLBFGS(energy, x, y, 0.1, smoothed_max=LPSmoothedMax(300, tol=1e-9), tol=1e-3).fit()
    assert bool(info.converged) and float(info.dual) <= float(info.primal)
    with torch.no_grad():  # the certified primal upper-bounds the exact LP-relaxed objective (scipy HiGHS)
        pot = energy(x)
        lp_hinge = lp_map(hamming_augment(pot, y)).value - pot.score(y)
        exact = primal_rho(energy, x, y, 0.1, 1e-4, lp_hinge)
    assert float(exact) <= float(info.primal) + 1e-9 and float(info.primal) <= float(exact) * (1 + 1e-3)


def random_loopy_potentials():
    """Potentials of 3 random models on the complete graph of 5 labels for chain_problem's 60 examples: (pot,
    unary [3, 60, 5, 2], pairwise [3, 60, 10, 2, 2], eps [3, 1])."""
    x, _ = chain_problem()
    energy = FinleyJoachimsEnergy(6, 5, Graph.complete(5), num_models=3).double()
    with torch.no_grad():
        for prm in energy.parameters():
            prm.normal_(generator=torch.Generator().manual_seed(0))
        pot = energy(x)
    eps = torch.tensor([[0.1], [0.05], [0.02]], dtype=torch.float64)
    return pot, pot.unary, pot.pairwise.expand(3, 60, *pot.pairwise.shape[2:]), eps


def test_lp_smoothed_max_subset_warm_starts_its_rows():
    """``subset(models)`` starts each model from its own rows of the last messages and writes them back (the
    solver evaluates only the models still open, so the batch shape changes)."""
    pot, U, P, eps = random_loopy_potentials()
    P = P[:, :1]
    smax = LPSmoothedMax(iters=200, tol=1e-6)
    smax(Potentials(U, P, pot.graph), eps)
    start = smax.messages.clone()
    rows = torch.tensor([True, False, True])
    value = smax.subset(rows)(Potentials(U[rows] * 1.1, P[rows], pot.graph), eps[rows])
    ref = smoothed_lp(Potentials(U[rows] * 1.1, P[rows], pot.graph), eps[rows], 200, messages=start[rows], tol=1e-6)
    assert torch.equal(value, ref.value) and torch.equal(smax.messages[rows], ref.messages)
    assert torch.equal(smax.messages[1], start[1])


class RecordingMax:
    """A smoothed max that records the example count of every call (and delegates to ``inner``)."""

    def __init__(self, inner) -> None:
        self.inner, self.rows = inner, []

    def __call__(self, pot, eps):
        self.rows.append(pot.batch_shape[1])
        return self.inner(pot, eps)


def streamed_case(kind: str):
    """(energy factory, x, y, factory of SmoothedLBFGS keyword args, mask) of each kind of objective the solvers
    stream (a fresh smoothed max per solver: the LP's messages are its own)."""
    x, y = chain_problem(N=70)
    n = y.shape[1]
    graph = Graph.complete(n) if kind == "lp" else Graph.chain(n)  # lp, loopy: the smoothed LP, chunk by chunk
    kwargs = {"lp": lambda: {"smoothed_max": LPSmoothedMax(300, tol=1e-9)},
              "crf": lambda: {"margin_scale": 0.0, "eps": 1.0}}.get(kind, dict)  # crf: the likelihood, entropy dual
    fold = torch.arange(70) % 3 != 0  # "folds": CV masks
    mask = torch.stack([fold, ~fold]) if kind == "folds" else None
    return lambda: FinleyJoachimsEnergy(6, n, graph, num_models=2).double(), x, y, kwargs, mask


@pytest.mark.parametrize("kind", ["tree", "lp", "crf", "folds"])
def test_a_streamed_objective_and_certificate_equal_the_whole_batch(kind, monkeypatch):
    """With ROW_CHUNK_ELEMENTS small, SmoothedHinge streams its objective, gradient and certificate over chunks of
    examples (delicious's Full: 11,628 rows x 7,588 edges in one smoothed-LP batch needed 237 GiB): every smoothed
    max call sees at most ``chunk_rows`` examples, and the values, gradients, certificates and the certified
    optimum are the whole batch's (up to rounding)."""
    from structtorch.optim import ModelSlices
    from structtorch.solvers import smoothing

    make, x, y, kwargs, mask = streamed_case(kind)
    whole = SmoothedLBFGS(make(), x, y, torch.tensor([0.1, 0.03], dtype=torch.float64), mask=mask, tol=1e-4,
                          **kwargs())
    per_row = 2 * max(whole.energy.graph.num_edges, 5) * 4  # M x max(E, n) x K^2
    monkeypatch.setattr(smoothing, "ROW_CHUNK_ELEMENTS", 16 * per_row + per_row // 2)  # 16 rows a chunk
    streamed = SmoothedLBFGS(make(), x, y, torch.tensor([0.1, 0.03], dtype=torch.float64), mask=mask, tol=1e-4,
                             **kwargs())
    assert whole.chunk_rows == 70 and streamed.chunk_rows == 16 and len(streamed.chunks()) == 5
    for solver in (whole, streamed):
        with torch.no_grad():
            for prm in solver.params:
                prm.copy_(0.3 * torch.randn(prm.shape, generator=torch.Generator().manual_seed(1), dtype=prm.dtype))
    a, b = whole.certify(), streamed.certify()
    for field in ("primal", "dual", "relative_gap"):
        assert torch.allclose(getattr(a, field), getattr(b, field), rtol=1e-7, atol=1e-9), field
    assert torch.allclose(whole.smoothing, streamed.smoothing, rtol=1e-7, atol=1e-9)
    value, grad = ModelSlices(whole.params, 2).value_and_grad(whole.objective)
    value_s, grad_s = ModelSlices(streamed.params, 2).value_and_grad(streamed.objective)
    assert torch.allclose(value, value_s, rtol=1e-7) and torch.allclose(grad, grad_s, rtol=1e-6, atol=1e-9)
    assert not isinstance(streamed.objective(), torch.Tensor)
    if kind != "lp":  # (the smoothed LP's own chunks: its test below)
        inner, streamed.smoothed_max = streamed.smoothed_max, RecordingMax(streamed.smoothed_max)
        ModelSlices(streamed.params, 2).value_and_grad(streamed.objective)
        # far from the optimum the moved biases could not certify, and their pass is skipped, but for a CRF's (a
        # fixed eps), which may move the iterate
        streamed.certify()
        moved = int(kind == "crf")
        assert max(streamed.smoothed_max.rows) == 16 and sum(streamed.smoothed_max.rows) == (2 + moved) * 70
        monkeypatch.setattr(smoothing, "BIAS_MOVE_REACH", float("inf"))
        streamed.certify()  # two passes: the iterate's, and with the biases moved
        assert max(streamed.smoothed_max.rows) == 16 and sum(streamed.smoothed_max.rows) == (4 + moved) * 70
        streamed.smoothed_max = inner
    a, b = whole.fit(max_iter=3000), streamed.fit(max_iter=3000)
    assert bool(a.converged.all()) and bool(b.converged.all())
    assert torch.allclose(a.primal, b.primal, rtol=3e-4)
    assert bool((b.dual <= a.primal + 1e-9).all()) and bool((a.dual <= b.primal + 1e-9).all())


def test_a_streamed_evaluation_stops_between_chunks_once_the_budget_is_spent(monkeypatch):
    """Full on delicious would take about 15 minutes a pass over its 11,628 rows: checked only between L-BFGS
    iterations, the time budget could be overrun by several passes. Within run(), a streamed evaluation stops between
    two chunks once the budget is spent and the step it belonged to is dropped (the parameters are where it
    started); the closing certificate is not interrupted."""
    from structtorch.optim import ModelSlices
    from structtorch.solvers import smoothing

    make, x, y, _, _ = streamed_case("tree")
    monkeypatch.setattr(smoothing, "ROW_CHUNK_ELEMENTS", 2 * 5 * 4 * 16)
    solver = SmoothedLBFGS(make(), x, y, torch.tensor([0.1, 0.03], dtype=torch.float64), tol=1e-4)
    solver.run(3)
    start, iterations = ModelSlices(solver.params, 2).flat(), solver.iterations
    calls = []
    monkeypatch.setattr(smoothing, "out_of_time", lambda: (calls.append(1), len(calls) > 2)[1])
    solver.run(5)
    assert len(calls) == 3 and solver.iterations == iterations and not solver.interruptible
    assert torch.equal(ModelSlices(solver.params, 2).flat(), start)
    info = solver.certify()
    assert len(calls) == 3 and bool(torch.isfinite(info.relative_gap).all())


def test_lp_smoothed_max_chunks_warm_start_their_own_examples():
    """``chunk(rows, total)`` starts each example from its own messages of the last pass and writes them back, for all
    models or a subset of them."""
    pot, U, P, eps = random_loopy_potentials()
    smax = LPSmoothedMax(iters=200, tol=1e-6)
    first = [smax.chunk(slice(i, i + 20), 60)(Potentials(U[:, i:i + 20], P[:, i:i + 20], pot.graph), eps)
             for i in range(0, 60, 20)]
    for i, value in zip(range(0, 60, 20), first):  # the first pass: each chunk from zeros, as alone
        alone = smoothed_lp(Potentials(U[:, i:i + 20], P[:, i:i + 20], pot.graph), eps, 200, tol=1e-6)
        assert torch.equal(value, alone.value) and torch.equal(smax.messages[:, i:i + 20], alone.messages)
    start, models, rows = smax.messages.clone(), torch.tensor([True, False, True]), slice(20, 40)
    value = smax.chunk(rows, 60, models)(Potentials(U[models][:, rows] * 1.1, P[models][:, rows], pot.graph),
                                         eps[models])
    again = smoothed_lp(Potentials(U[models][:, rows] * 1.1, P[models][:, rows], pot.graph), eps[models], 200,
                        messages=start[models][:, rows], tol=1e-6)
    assert torch.equal(value, again.value) and torch.equal(smax.messages[models][:, rows], again.messages)
    assert torch.equal(smax.messages[1], start[1]) and torch.equal(smax.messages[:, :20], start[:, :20])


@pytest.mark.parametrize("input_dependent_pairwise", [False, True])
def test_float32_objective_at_hundreds_of_labels_keeps_float64s_gradient(input_dependent_pairwise):
    """300 labels, a confident model (each example's loss is far below its labelling's score): the float32
    objective and gradient stay within rounding of the potentials of float64's. Taking the smoothed max and the
    score as two numbers of that size (before ``_relative``) lost 1.2e-5 of the loss and 1.6e-6 of the gradient:
    at corel5k's shape L-BFGS then stalled near the optimum (13-29 evaluations a step)."""
    g = torch.Generator().manual_seed(0)
    N, D, n = 100, 8, 300
    x = torch.randn(N, D, generator=g, dtype=torch.float64)
    energy = LinearTableEnergy(D, n, 2, Graph.chain(n), input_dependent_pairwise=input_dependent_pairwise).double()
    with torch.no_grad():
        for p in energy.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64))
        energy.unary.bias.view(n, 2)[:, 0] += 3.0  # sparse labels, as Mulan's
        energy.unary.weight.mul_(5.0)
        y = energy(x).unary.argmax(-1)
    value, grad = {}, {}
    for dtype in (torch.float64, torch.float32):
        solver = SmoothedLBFGS(energy, x, y, 1e-6, margin_scale=0.0, eps=1.0, dtype=dtype)
        value[dtype], grad[dtype] = solver.opt.value.double(), solver.opt.grad.double()
    assert float(value[torch.float64]) < 0.2 * n  # each example's loss is a small part of its score
    assert float((value[torch.float32] - value[torch.float64]).abs()) <= 6e-6
    assert float((grad[torch.float32] - grad[torch.float64]).abs().max()) <= 8e-7


def test_smoothed_lbfgs_bad_input():
    energy = FinleyJoachimsEnergy(3, 2).double()
    x, y = torch.randn(4, 3, dtype=torch.float64), torch.zeros(4, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="lam"):
        SmoothedLBFGS(energy, x, y, -1.0)
    with pytest.raises(ValueError, match="same N"):
        SmoothedLBFGS(energy, x, y[:3], 0.1)
    with pytest.raises(ValueError, match="tol"):
        SmoothedLBFGS(energy, x, y, 0.1, tol=0.0)
    with pytest.raises(ValueError, match="margin_scale"):
        SmoothedLBFGS(energy, x, y, 0.1, margin_scale=0.0)
    with pytest.raises(ValueError, match="y"):
        SmoothedLBFGS(energy, x, y + 2, 0.1)
    with pytest.raises(TypeError, match="Energy"):
        SmoothedLBFGS(torch.nn.Linear(3, 2), x, y, 0.1)


# ---------------------------------------------------------------------- BCFW's block steps (Gauss-Seidel on a box)
def _box_problem(seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random PSD A [M, C, B, B] (rank below B, two zero directions), g and ok [M, C, B]."""
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(2, 3, 24, 8, generator=gen, dtype=torch.float64)
    X[:, :, [3, 17]] = 0  # directions that cost nothing: a full step where their gain is positive
    A, g = X @ X.transpose(-1, -2), torch.randn(2, 3, 24, generator=gen, dtype=torch.float64)
    return A.to(dtype), g.to(dtype), torch.rand(2, 3, 24, generator=gen) > 0.2


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_block_steps_kernel_gives_the_eager_steps(fused_kernels, seed, dtype):
    """BCFW's block steps on backend "fused" (one kernel call, ``box_gauss_seidel``) equal the loop of batched
    torch ops, free directions and masked blocks included."""
    from structtorch.inference import backend
    from structtorch.solvers.bcfw import _gauss_seidel

    A, g, ok = _box_problem(seed, dtype)
    gamma = _gauss_seidel(A, g, ok, 3)
    with backend("eager"):
        ref = _gauss_seidel(A, g, ok, 3)
    torch.testing.assert_close(gamma, ref)
    assert gamma.dtype == dtype and gamma.shape == g.shape


@pytest.mark.parametrize("name", ["fused", "eager"])
def test_block_steps_reach_the_box_qp_optimum(name):
    """Enough sweeps give the maximiser of gamma . g - 1/2 gamma^T A gamma on [0, 1]^B (zero where not ok): the
    projected gradient vanishes on every coordinate that moves, and free directions take the full step."""
    from structtorch.inference import backend
    from structtorch.solvers.bcfw import _gauss_seidel

    A, g, ok = _box_problem(7, torch.float64)
    with backend(name):
        gamma = _gauss_seidel(A, g, ok, 2000)
    grad = g - (A @ gamma[..., None])[..., 0]
    inside = (gamma > 1e-9) & (gamma < 1 - 1e-9)
    assert float(grad[inside & ok].abs().max()) < 1e-6
    assert bool((grad[(gamma <= 1e-9) & ok] <= 1e-6).all()) and bool((grad[(gamma >= 1 - 1e-9) & ok] >= -1e-6).all())
    assert bool((gamma[~ok] == 0).all())
    free = torch.zeros_like(ok)
    free[:, :, [3, 17]] = True
    torch.testing.assert_close(gamma[free & ok], (g[free & ok] > 0).double())
