"""Exact LP relaxation of MAP over the local polytope, by scipy's HiGHS: the reference for ``smoothed_lp``.

    LP(theta) = max_{mu}  sum_i <mu_i, theta_i> + sum_e <mu_e, theta_e>
    s.t.  sum_x mu_i(x) = 1,  sum_{x_j} mu_e(x_i, x_j) = mu_i(x_i),  sum_{x_i} mu_e(x_i, x_j) = mu_j(x_j),
          mu >= 0,  and mu = 0 wherever theta = -inf.

Solved per example on the CPU (one ``linprog`` call each); the constraint matrix is built once
per graph and cached.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import linprog
from scipy.sparse import coo_matrix, csr_matrix

from ..graph import Graph
from ..potentials import Potentials
from .smoothed import MarginalValue

__all__ = ["LPResult", "lp_map"]


@dataclass
class LPResult:
    """Output of ``lp_map`` (batch dims *B of the potentials).

    value: [*B] LP optimum (-inf where the local polytope restricted to finite potentials is
        empty); differentiable, gradient = the LP solution (a subgradient of the convex LP value).
    unary: [*B, n, K] LP solution mu_i (zeros where infeasible).
    pairwise: [*B, E, K, K] LP solution mu_e (stored edge orientation).
    assignment: [*B, n] argmax of ``unary`` (lowest state on ties; fractional solutions round).
    """

    value: torch.Tensor
    unary: torch.Tensor
    pairwise: torch.Tensor
    assignment: torch.Tensor

    def decode(self) -> torch.Tensor:
        """The decoded assignment [*B, n]."""
        return self.assignment


def _constraints(graph: Graph, K: int) -> tuple[csr_matrix, np.ndarray]:
    """A_eq [n + 2EK, nK + EK^2], b_eq: normalisation rows, then both marginalisation blocks."""
    n, E = graph.num_nodes, graph.num_edges
    edges = graph.edges.numpy()
    nu = n * K
    rows, cols, vals = [], [], []
    # sum_x mu_i(x) = 1
    rows.append(np.repeat(np.arange(n), K))
    cols.append(np.arange(nu))
    vals.append(np.ones(nu))
    e, a, b = (t.reshape(-1) for t in np.meshgrid(np.arange(E), np.arange(K), np.arange(K), indexing="ij"))
    pair_col = nu + (e * K + a) * K + b
    for side, state in ((0, a), (1, b)):  # sum over the other endpoint's state
        row = n + side * E * K + e * K + state
        rows += [row, n + side * E * K + np.arange(E * K)]
        node_state = edges[np.arange(E * K) // K, side] * K + np.arange(E * K) % K
        cols += [pair_col, node_state]
        vals += [np.ones(E * K * K), -np.ones(E * K)]
    A = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                   shape=(n + 2 * E * K, nu + E * K * K)).tocsr()
    b_eq = np.concatenate([np.ones(n), np.zeros(2 * E * K)])
    return A, b_eq


def _solve_one(theta: np.ndarray, A: csr_matrix, b_eq: np.ndarray) -> tuple[float, np.ndarray]:
    """One LP: theta [N] flat (unary then pairwise) -> (value, mu [N])."""
    finite = np.isfinite(theta)
    c = -np.where(finite, theta, 0.0)
    bounds = np.stack([np.zeros_like(theta), np.where(finite, 1.0, 0.0)], 1)
    res = linprog(c, A_eq=A, b_eq=b_eq, bounds=bounds, method="highs")
    if res.status == 2:  # infeasible
        return -math.inf, np.zeros_like(theta)
    if res.status != 0:
        raise RuntimeError(f"lp_map: HiGHS failed ({res.status}): {res.message}")
    return float(-res.fun), np.clip(res.x, 0.0, 1.0)


def lp_map(pot: Potentials) -> LPResult:
    """Exact LP relaxation over the local polytope, one HiGHS solve per example (CPU).

    pot: Potentials on a single graph; unary [*B, n, K], pairwise [*B, E, K, K].
    Returns an ``LPResult`` on the potentials' device and dtype. ``value >= max_y score(y)``,
    with equality on trees and forests.
    """
    if not isinstance(pot, Potentials):
        raise TypeError(f"lp_map expects a structtorch.Potentials, got {type(pot).__name__}")
    g = pot.graph
    if g.is_ensemble:
        raise ValueError("lp_map needs a single graph (edges [E, 2]), got an ensemble")
    batch, n, E, K = pot.batch_shape, g.num_nodes, g.num_edges, pot.num_states
    B = math.prod(batch)
    unary, pair = pot.expanded()
    unary, pair = unary.reshape(B, n, K), pair.reshape(B, E, K, K)
    theta = torch.cat([unary.detach().reshape(B, n * K), pair.detach().reshape(B, E * K * K)], 1)  # B may be 0
    theta = theta.to("cpu", torch.float64).numpy()
    A, b_eq = g.cached(("lp_constraints", K), "cpu", lambda: _constraints(g, K))  # once per (graph, K)
    values, mus = np.zeros(B), np.zeros_like(theta)
    for k in range(B):
        values[k], mus[k] = _solve_one(theta[k], A, b_eq)
    like = dict(device=pot.device, dtype=pot.dtype)
    mu = torch.as_tensor(mus).to(**like)
    mu_u, mu_p = mu[:, : n * K].reshape(B, n, K), mu[:, n * K:].reshape(B, E, K, K)
    value = MarginalValue.apply(unary, pair, torch.as_tensor(values).to(**like), mu_u, mu_p)
    return LPResult(value.reshape(batch), mu_u.reshape(*batch, n, K), mu_p.reshape(*batch, E, K, K),
                    mu_u.argmax(-1).reshape(*batch, n))
