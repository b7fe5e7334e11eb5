"""Certified full-batch solver for structured SVMs and CRFs: L-BFGS on the entropy-smoothed loss.

Objective (the same primal as ``BCFW``; biases regularised with weight ``bias_reg``, M models at once):

    P(w) = lambda/2 (|W|^2 + rho |b|^2) + (1/N) sum_i [max_y (score(x_i, y; w) + Delta(y_i, y)) - score(x_i, y_i; w)].

The max is replaced by its entropy-smoothed version eps * log sum_y exp((score + Delta) / eps)
(``tree_smoothed_max``: exact on trees; ``LPSmoothedMax``: the smoothed LP relaxation on loopy
graphs), a smooth convex upper bound within eps * n log K of the max (Nesterov smoothing), which
full-batch L-BFGS minimises fast. Its gradient w.r.t. the potentials are marginals mu_i, a point of
the marginal (local) polytope, hence a dual point of the structured SVM, and

    D(mu) = -lambda/2 |w(mu)|_R^2 + (1/N) sum_i <Delta_i, mu_i>,
    w(mu) = 1/(lambda N) R^-1 grad_w sum_i <pot(x_i; w), m(y_i) - mu_i>      (R = diag(1, rho on biases))

is a lower bound on the optimum for every mu (linear energies; see ``BCFW``). The certificate is
P(w) - D(mu(w)) >= P(w) - P*; at the optimum of the smoothed problem it is at most eps/N sum_i H(mu_i),
so eps is lowered (continuation) whenever the gap is within twice that term, until the relative gap
is <= tol. The dual pays each bias's gradient squared over lambda rho, so with rho small it lags the primal;
each certificate of an energy with a ``label_bias`` also takes the dual point of the parameters with the biases
moved, label by label, to zero their gradient (``label_bias_shift``, from the marginals), and mixes both into its
bound (``SmoothedLBFGS.mix_dual``) without moving the iterate; with a fixed eps the edges' biases are then moved too,
edge by edge (``pair_bias_shift``), and the iterate takes the lower of the two points where its objective falls there
(a block step, kept by L-BFGS as one more curvature pair). With a fixed ``eps`` (CRFs: eps = 1,
margin_scale = 0) the solver minimises the smoothed objective itself and certifies it against its own dual
(entropy included):
D_eps(mu) = D(mu) + eps/N sum_i H(mu_i).

Loopy graphs (``LPSmoothedMax``): the max is the LP relaxation's, so the certificate is for the
LP-relaxed objective, and it holds up to the inner LP solver's convergence (its pseudo-marginals lie
in the local polytope only at convergence).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from torch.nn.functional import one_hot

from ..energies import Energy
from ..graph import Graph, check_float
from ..inference import smoothed_lp, tree_logz, tree_map
from ..inference.smoothed import available_memory
from ..losses import hamming_margin
from ..optim import BatchedLBFGS, ModelSlices
from ..potentials import Potentials
from ..progress import OutOfTime, out_of_time, tick
from ..structure.circuit_rank import circuit_rank
from ..structure.spanning import max_spanning_tree
from .bcfw import check_lam, check_mask, lift_models
from .certificate import GapInfo, certificate

__all__ = ["HISTORY_MEMORY_SHARE", "ForestSmoothedMax", "LPSmoothedMax", "SmoothedHinge", "SmoothedLBFGS",
           "SmoothedMax", "history_that_fits", "tree_smoothed_max"]

log = logging.getLogger(__name__)

#: elements of one [M, rows, E, K, K] block (E: the edges, at least the labels) of a chunk of ``SmoothedHinge``'s
#: streamed objective and certificate: 2^24 doubles, 134 MB (the smoothed LP holds about 9 such blocks)
ROW_CHUNK_ELEMENTS = 2**24

#: the share of the memory available when an L-BFGS fit starts that its curvature pairs may take (a pair is two
#: copies of every parameter). MAM at rcv1subset's shape (``scripts/mulan_like.py``: 10 trees x 602 tables x 47,236
#: features, 284M parameters, a pair 2.1 GiB, 13.9 GiB available) was killed by the operating system at its third
#: iteration with 20 pairs allowed, and at the end of its fit (peak 24.4 GB on 24) with 3 (a share of 0.5)
HISTORY_MEMORY_SHARE = 0.25

#: the most elements [M, N, n] of the marginals' logits a certificate keeps to move the labels' biases
#: (``SmoothedLBFGS.certify``; 2^24: 67 MB in float32, and ``label_bias_shift``'s float64 temporaries about 0.5 GB;
#: delicious: 12.7M); above, it does not move them
BIAS_MOVE_ELEMENTS = 2**24

#: a certificate takes the moved biases' dual point (a pass over the data) only where its gap less the biases' share
#: of its dual's quadratic term is within this many times the tolerance: where the point could certify (elsewhere its
#: pass would take a budget-bound fit's time for a gap that stays far from the tolerance). FixedTree on delicious ended
#: its budget at a relative gap of 0.22 with it, 0.29 with the point at every certificate. A fixed eps (a CRF) takes
#: the pass at every certificate: its point may also move the iterate
BIAS_MOVE_REACH = 10.0

#: the most elements [M, N, E, K^2] of the edges' log pairwise marginals a CRF's certificate keeps to move the edges'
#: biases after the labels' (``pair_bias_shift``; 2^24: 67 MB in float32); above, it moves the labels' alone. At
#: delicious' fit (11,628 rows x 982 edges x 4: 45.7M) the move and its pass took a certificate from about 8 s to
#: 20 s, a third of the budget-bound fit's 65 s, and TreeCRF ended at 0.41 / 21.65 (subset / example F1) against
#: 0.50 / 23.02 without it
PAIR_MOVE_ELEMENTS = 2**24

#: (Potentials [M, N], eps [M, 1]) -> differentiable smoothed max [M, N] >= max_y score(y), each model at its
#: own temperature; its gradient w.r.t. the potentials is the marginals
SmoothedMax = Callable[[Potentials, torch.Tensor], torch.Tensor]


def tree_smoothed_max(pot: Potentials, eps: torch.Tensor) -> torch.Tensor:
    """eps * log sum_y exp(score(y) / eps) [M, N] on a tree or forest (exact); eps [M, 1]."""
    if bool((eps == 1).all()):  # a CRF's log Z: no copies of the potentials (and of their gradients) divided by 1
        return tree_logz(pot)
    e = eps[..., None, None]
    return eps * tree_logz(Potentials(pot.unary / e, pot.pairwise / e[..., None], pot.graph))


class LPSmoothedMax:
    """The entropy-smoothed LP relaxation (``smoothed_lp``, any graph) as a SmoothedMax: all models and
    examples in one call, each model at its own temperature, warm-started from the previous call's
    messages when the shapes match (any messages give an upper bound; each problem sweeps until its dual
    decreases by less than ``tol`` eps, so the start only changes the number of sweeps). ``subset(models)``
    evaluates some models only, warm-started from (and updating) their rows of the messages; ``chunk(rows,
    total, models)`` the examples ``rows`` of ``total`` only (a streamed objective), each warm-started from its own
    messages of the previous pass."""

    def __init__(self, iters: int = 100, tol: float | None = 1e-6) -> None:
        self.iters, self.tol = iters, tol
        self.messages: torch.Tensor | None = None  # [M, N, E, 2, K] of the last call (of all chunks)

    def __call__(self, pot: Potentials, eps: torch.Tensor) -> torch.Tensor:
        return self._solve(pot, eps, None)

    def subset(self, models: torch.Tensor) -> SmoothedMax:
        """The smoothed max of the models where ``models`` [M] (bool) is True: Potentials [M', N], eps [M', 1]."""
        return lambda pot, eps: self._solve(pot, eps, models)

    def chunk(self, rows: slice, total: int, models: torch.Tensor | None = None) -> SmoothedMax:
        """The smoothed max of examples ``rows`` of ``total`` (of the models where ``models`` [M] is True; None:
        all): Potentials [M', rows], eps [M', 1]; warm-started from, and updating, those examples' messages."""
        return lambda pot, eps: self._solve(pot, eps, models, rows, total)

    def _solve(self, pot: Potentials, eps: torch.Tensor, models: torch.Tensor | None, rows: slice | None = None,
               total: int | None = None) -> torch.Tensor:
        if rows is not None:
            M = pot.batch_shape[0] if models is None else models.shape[0]
            want = (M, total, pot.graph.num_edges, 2, pot.num_states)
            if self.messages is None or tuple(self.messages.shape) != want or self.messages.dtype != pot.dtype:
                self.messages = pot.unary.new_zeros(want)  # zeros: a cold start, as no messages
        store = self.messages
        if store is not None and models is not None:
            store = store[models] if store.shape[0] == models.shape[0] else None
        if store is not None and rows is not None:
            store = store[:, rows]
        warm = store if store is not None and store.shape[:-3] == pot.batch_shape and store.dtype == pot.dtype \
            else None
        res = smoothed_lp(pot, eps, self.iters, messages=warm, tol=self.tol)
        if models is None and rows is None:
            self.messages = res.messages
        elif warm is not None:
            self.messages[slice(None) if models is None else models, slice(None) if rows is None else rows] = \
                res.messages
        return res.value


class ForestSmoothedMax:
    """Exact smoothed max for M models on one candidate graph, model m restricted to its own forest.

    forests: bool [M, E] over ``graph``'s edges, each row a forest. Model m's forest is padded to the
    largest forest's size k (at least 1) with zero-weight edges of a spanning forest of ``graph`` containing
    it (which change no score and close no cycle; ``graph`` needs an edge), and the M forests of k edges are
    one ensemble graph, so a single ``tree_logz`` call is exact for every model (``exact`` is the same with
    ``tree_map``) and costs k edges
    per model, not n - 1.
    Potentials passed in are the candidate graph's [M, N] (an energy with ``num_models=M``); the weights
    of edges outside model m's forest get no gradient from the data term.
    """

    def __init__(self, forests: torch.Tensor, graph: Graph) -> None:
        if forests.dtype != torch.bool or forests.dim() != 2 or forests.shape[1] != graph.num_edges:
            raise ValueError(f"forests must be a bool tensor [M, E={graph.num_edges}], got {forests.dtype} "
                             f"{tuple(forests.shape)}")
        if bool((circuit_rank(forests.cpu(), graph) > 0).any()):
            raise ValueError("every row of forests must be a forest (no cycle)")
        n = graph.num_nodes
        spanning = max_spanning_tree(forests.to(torch.float64) + 1.0, graph)  # forest edges first
        self.graph = graph
        k = max(1, int(forests.sum(1).max()))
        order = (2 * forests.long() + spanning.long()).sort(dim=1, descending=True, stable=True).indices
        self.index = order[:, :k]  # [M, k] candidate edge ids: the forest's, then spanning-tree padding
        self.keep = forests.gather(1, self.index)  # [M, k]
        self.trees = Graph(n, graph.edges[self.index.cpu()]) if n > 1 else None
        self._subsets: dict[bytes, ForestSmoothedMax] = {}  # subset(): the last masks asked for

    def subset(self, models: torch.Tensor) -> ForestSmoothedMax:
        """The same for the models where ``models`` [M] (bool) is True (``SmoothedLBFGS`` evaluates only
        the models still open); cached per mask (its graph keeps its tree schedules), the last 8 masks."""
        key = bytes(models.cpu().numpy())
        if key not in self._subsets:
            sub = copy.copy(self)
            on = models.to(self.index.device)
            sub.index, sub.keep, sub._subsets = self.index[on], self.keep[on], {}
            sub.trees = Graph(self.graph.num_nodes, self.graph.edges[sub.index.cpu()]) if self.trees else None
            if len(self._subsets) >= 8:
                del self._subsets[next(iter(self._subsets))]
            self._subsets[key] = sub
        return self._subsets[key]

    def ensemble(self, pot: Potentials, scale: torch.Tensor | None = None) -> Potentials:
        """The [N, M] ensemble potentials of candidate-graph potentials [M, N] (divided by scale [M, 1])."""
        U, P = pot.unary, pot.pairwise  # [M, N, n, K], [M, 1 or N, E, K, K]
        if scale is not None:
            U, P = U / scale[..., None, None], P / scale[..., None, None, None]
        idx = self.index.to(P.device)[:, None, :, None, None].expand(*P.shape[:2], -1, *P.shape[-2:])
        P = P.gather(2, idx) * self.keep.to(P.device)[:, None, :, None, None].to(P.dtype)
        return Potentials(U.transpose(0, 1), P.transpose(0, 1), self.trees)

    def __call__(self, pot: Potentials, eps: torch.Tensor) -> torch.Tensor:
        """eps * log sum_y exp(score_m(y) / eps) [M, N] on each model's forest; eps [M, 1]."""
        if self.trees is None:
            return tree_smoothed_max(pot, eps)
        return eps * tree_logz(self.ensemble(pot, eps)).transpose(0, 1)

    def exact(self, pot: Potentials) -> torch.Tensor:
        """max_y score_m(y) [M, N] on each model's forest."""
        with torch.no_grad():
            if self.trees is None:
                return tree_map(pot)[0]
            return tree_map(self.ensemble(pot))[0].transpose(0, 1)


class SquaredRows(torch.autograd.Function):
    """|t_m|^2 [M] of rows t [M, P] without a [M, P] temporary; its backward 2 g_m t_m makes one (vector_norm's
    made two: t / |t| and its product with g)."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(rows)
        return torch.linalg.vector_norm(rows, dim=1).square()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (rows,) = ctx.saved_tensors
        return rows * (2 * grad)[:, None]


def label_bias_shift(logits: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                     curvature: torch.Tensor, eps: torch.Tensor, iters: int = 100) -> torch.Tensor:
    """The shift d [M, n] of the labels' biases b [M, n] that zeroes their gradient

        curvature_m (b_l + d_l) + sum_i weight_mi (sigma(z_mil + d_l / eps_m) - y_il) = 0

    where z [M, N, n] are the logits of the labels' state-1 marginals at b, weight [M, N] the examples' weights
    (mask / N_m), curvature [M] lambda rho and eps [M] the temperature. Adding d_l to label l's bias alone turns its
    marginal into sigma(z_l + d_l / eps) exactly (the distribution is reweighted by exp(d_l y_l / eps)), so each
    label's equation is exact; moving all biases at once, their couplings are not counted. Each root is unique (the
    left side increases in d_l) and found by Newton steps kept within a bisection bracket (``iters`` at most: the
    bracket is 4 / curvature wide, 4e7 at curvature 1e-7, which bisection alone takes 60 halvings to bring to 1e-10)."""
    z, y1, w = logits.double(), y.to(torch.float64), weight.double()[..., None]
    b, c, e = bias.detach().double(), curvature.double()[:, None], eps.double()[:, None]
    width = 2.0 / c  # |sum_i weight_mi (sigma - y)| <= 1: the root is within 1 / c of -b (a margin of twice that)
    lo, hi, d = -b - width, -b + width, torch.zeros_like(b)
    for _ in range(iters):
        s = torch.sigmoid(z + (d / e)[:, None, :])
        g = c * (b + d) + ((s - y1) * w).sum(1)
        lo, hi = torch.where(g < 0, d, lo), torch.where(g > 0, d, hi)
        newton = d - g / (c + (s * (1 - s) * w).sum(1) / e)
        # a root whose Newton step is below d's rounding stays (that step lands on d = lo or hi, outside the open
        # bracket, and bisection had sent the root away)
        settled = (g.abs() <= 1e-15) | (newton == d)
        if bool(settled.all()):
            break
        d = torch.where(settled, d, torch.where((newton > lo) & (newton < hi), newton, 0.5 * (lo + hi)))
    return d


def pair_bias_shift(log_mu: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                    curvature: torch.Tensor, eps: torch.Tensor, iters: int = 6, chunk: int = 2**22) -> torch.Tensor:
    """The shift d [M, E, Q] of the edges' bias tables b [M, E, Q] (Q = K^2 entries, flattened) towards the root of

        curvature_m (b_e + d_e) + sum_i weight_mi (softmax(l_mie + d_e / eps_m) - onehot(state_ie)) = 0

    where l [M, N, E, Q] are the logs of the edges' pairwise marginals at b, state [N, E] each edge's entry at y_i,
    weight [M, N], curvature [M] and eps [M] as in ``label_bias_shift``. Adding d_e to edge e's table alone reweights
    the distribution by exp(d_e(y_a, y_b) / eps), so its pairwise marginal becomes softmax(l_e + d_e / eps) exactly:
    each edge's equation is exact (the edges share labels, so moving all at once is not). The root minimises the
    strictly convex F_e(d) = curvature/2 |b_e + d|^2 + eps sum_i w_i logsumexp(l_ie + d / eps) - sum_i w_i d[state_ie];
    damped Newton steps (at most 4 eps long in the max norm: a pair the model gives almost no mass needs a shift of
    several eps, where the Hessian is about the curvature, 1e-5 at bias_reg 1e-4) with Armijo's rule per edge, one
    streamed pass over the rows (``chunk`` elements of [M, rows, E, Q] at a time) per step, ``iters`` at most."""
    M, N, E, Q = log_mu.shape
    w, b = weight.double(), bias.detach().double()
    c, e = curvature.double()[:, None, None], eps.double()[:, None, None]
    rows = max(1, chunk // max(1, M * E * Q))
    spans = [slice(i, min(i + rows, N)) for i in range(0, N, rows)]
    target = sum(torch.einsum("mr,req->meq", w[:, r], one_hot(state[r], Q).to(w)) for r in spans)  # [M, E, Q]
    eye = torch.eye(Q, dtype=torch.float64, device=b.device)

    def at(d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # F [M, E], gradient, Hessian
        value = 0.5 * c[..., 0] * (b + d).square().sum(-1) - (target * d).sum(-1)
        first, second = torch.zeros_like(b), b.new_zeros(M, E, Q, Q)
        for r in spans:
            z = log_mu[:, r].double().add_((d / e)[:, None])  # [M, rows, E, Q]
            top = z.amax(-1, keepdim=True)  # finite: a marginal has mass somewhere
            p = z.sub_(top).clamp_(min=-300.0).exp_()  # no subnormal products (slow): exp(-300) is 5e-131
            total = p.sum(-1, keepdim=True)
            p.div_(total)  # softmax; logsumexp = top + log total
            value += e[..., 0] * torch.einsum("mr,mre->me", w[:, r], total.log_().add_(top)[..., 0])
            wp = p * w[:, r, None, None]
            first += wp.sum(1)
            for q in range(Q):  # the Q (Q + 1) / 2 products: 2x faster than one einsum over the rows
                for k in range(q, Q):
                    second[..., q, k] += torch.einsum("mre,mre->me", wp[..., q], p[..., k])
        second = torch.triu(second) + torch.triu(second, 1).transpose(-1, -2)
        hessian = c[..., None] * eye + (torch.diag_embed(first) - second) / e[..., None]
        return value, c * (b + d) + first - target, hessian

    d, t = torch.zeros_like(b), torch.ones_like(b[..., :1])
    value, grad, hessian = at(d)
    step = _newton_step(grad, hessian, 4 * e)
    for _ in range(iters):
        trial, slope = at(d + t * step), t[..., 0] * (grad * step).sum(-1)
        # Armijo per edge [M, E], or a change below F's rounding (Newton's own steps: the quadratic region)
        ok = (trial[0] <= value + 1e-4 * slope) | (-slope <= 1e-13 * value.abs())
        d = torch.where(ok[..., None], d + t * step, d)
        value, grad, hessian = (torch.where(ok[(...,) + (None,) * (a.dim() - 2)], a, old)
                                for a, old in zip(trial, (value, grad, hessian)))
        step = torch.where(ok[..., None], _newton_step(grad, hessian, 4 * e), step)
        t = torch.where(ok[..., None], 1.0, 0.5 * t)
        if not bool(step.any()):  # every edge at its root
            break
    return d


def _newton_step(grad: torch.Tensor, hessian: torch.Tensor, longest: torch.Tensor) -> torch.Tensor:
    """-H^-1 g [M, E, Q] for gradients g [M, E, Q] and Hessians H [M, E, Q, Q], scaled down to at most ``longest``
    [M, 1, 1] in the max norm; 0 where it is below 1e-12."""
    step = -torch.linalg.solve(hessian, grad)
    size = step.abs().amax(-1, keepdim=True)
    # an edge whose step is below 1e-12 is at its root: its steps would go on shrinking quadratically into
    # subnormal numbers, which made every later pass 5x slower
    return torch.where(size > 1e-12, step * (longest / size.clamp_min(1e-12)).clamp(max=1.0), 0.0)


def _tree_max(pot: Potentials) -> torch.Tensor:
    with torch.no_grad():
        return tree_map(pot)[0]


class SmoothedHinge:
    """The entropy-smoothed structured hinge (or CRF likelihood) of a linear energy and its duality-gap
    certificate, for M models at once; what ``SmoothedLBFGS`` minimises and CRANK's CCCP linearises.

    Args:
        energy: an ``Energy`` linear in its parameters on a single graph (``num_models=M``: M models at once).
        x [N, D], y [N, n] long: the training set.
        lam: lambda > 0, a float or a tensor [M].
        smoothed_max: ``tree_smoothed_max`` (trees, forests), ``LPSmoothedMax(...)`` (loopy graphs) or
            ``ForestSmoothedMax`` (each model on its own forest; a smoothed max with a ``subset(models)``
            method is narrowed to the models in ``evaluated``).
        exact_max: the max itself for the primal value (default: tree_map's score when smoothed_max is
            ``tree_smoothed_max``, else None: the primal uses the smoothed max, an upper bound).
        margin_scale: weight of the Hamming loss (0 with a fixed eps: the CRF likelihood at eps = 1).
        bias_reg: rho > 0, the regulariser weight of parameters named ``*bias`` relative to lambda.
        tol: relative duality gap at which a model is certified.
        eps: None: the temperature is the solver's to lower (starts at margin_scale); a float: that fixed
            temperature (the smoothed objective is the objective, e.g. eps = 1 for a CRF).
        mask: bool [M, N] (or [N]), the examples each model trains on (CV folds); default all.
        dtype: the precision of the objective (default float64: a 1e-3 certificate needs more than float32's
            line searches resolve). When it differs from the energy's, ``energy`` is a copy in ``dtype`` and
            ``write_back()`` casts the parameters into the original (``target``).

    The objective, its gradient and the certificate are streamed over chunks of ``chunk_rows`` examples, so that
    no [M, rows, E, K, K] block exceeds ``ROW_CHUNK_ELEMENTS`` elements (one chunk, the whole set, on every dataset
    of the papers): memory does not grow with N x E x K^2, and the time stays linear in N. Within ``SmoothedLBFGS.run``
    a streamed evaluation stops between chunks once the run's time budget is spent (``OutOfTime``; the step is
    dropped), so one long pass does not run far past the budget.
    """

    def __init__(self, energy: Energy, x: torch.Tensor, y: torch.Tensor, lam: float | torch.Tensor,
                 smoothed_max: SmoothedMax = tree_smoothed_max, exact_max: Callable | None = None,
                 margin_scale: float = 1.0, bias_reg: float = 1e-4, tol: float = 1e-3, eps: float | None = None,
                 mask: torch.Tensor | None = None, dtype: torch.dtype = torch.float64) -> None:
        if not isinstance(energy, Energy) or energy.graph.is_ensemble:
            raise TypeError("energy must be a structtorch Energy on a single graph")
        if x.dim() != 2 or y.dim() != 2 or x.shape[0] != y.shape[0] or x.shape[0] < 1:
            raise ValueError(f"x [N, D] and y [N, n] must have the same N >= 1 rows, got {tuple(x.shape)} and "
                             f"{tuple(y.shape)}")
        bias_reg, tol = check_float(bias_reg, "bias_reg", 0.0), check_float(tol, "tol", 0.0)
        if eps is not None:
            eps = check_float(eps, "eps", 0.0, expected="None or a number > 0")
        margin_scale = check_float(margin_scale, "margin_scale", 0.0, strict=eps is None,
                                   expected="a number > 0 (>= 0 with a fixed eps)")
        self.target = energy
        if next(energy.parameters()).dtype != dtype:
            energy = copy.deepcopy(energy).to(dtype)
        self.energy, self.smoothed_max, self.tol = energy, smoothed_max, float(tol)
        self.x = energy.stored_inputs(x.to(dtype))  # [N, D], read by row slices at every evaluation
        self.exact_max = exact_max if exact_max is not None or smoothed_max is not tree_smoothed_max else _tree_max
        self.num_models = energy.num_models
        named = list(energy.named_parameters())
        self.params = [p for _, p in named]
        ref = self.params[0]
        self._reg_weight = [bias_reg if n.endswith("bias") else 1.0 for n, _ in named]
        M = 1 if self.num_models is None else self.num_models
        self.lam = check_lam(lam, M, ref)
        self.mask = check_mask(mask, M, x.shape[0], ref.device).to(ref.dtype)
        self.count = self.mask.sum(1)
        with torch.no_grad():
            pot = energy(self.x[:1])
        self.y = pot.check_labels(y)
        self.K = K = pot.num_states
        self.y_small = self.y.to(torch.int16 if K * K <= 2**15 else torch.long)  # y_a K + y_b fits
        self.edges = energy.graph.edges.reshape(-1, 2).to(ref.device)  # [E, 2]
        per_row = M * max(self.edges.shape[0], y.shape[1]) * K * K
        self.chunk_rows = max(1, min(len(y), ROW_CHUNK_ELEMENTS // per_row))
        self.interruptible = False  # True: a streamed objective stops between chunks once the time budget is spent
        self.delta = hamming_margin(self.y, K, margin_scale, ref.dtype)
        self.fixed_eps = eps is not None
        self.eps = torch.full_like(self.lam, float(eps) if self.fixed_eps else float(margin_scale))  # [M]
        self.last: GapInfo | None = None
        self.smoothing: torch.Tensor | None = None  # eps/N sum_i H(mu_i) [M] at the last certificate
        self.evaluated = torch.ones_like(self.lam, dtype=torch.bool)  # models whose objective is computed

    # ------------------------------------------------------------------ objective

    def regularizer(self) -> torch.Tensor:
        """lambda/2 |w|_R^2 [M]."""
        return 0.5 * self.lam * self._squares(self.params, self._reg_weight)

    def chunks(self) -> list[slice]:
        """The examples of each chunk of the streamed objective and certificate."""
        N, c = len(self.y), self.chunk_rows
        return [slice(i, min(i + c, N)) for i in range(0, N, c)]

    def _relative(self, U: torch.Tensor, P: torch.Tensor, rows: slice
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Unary U [M, rows, n, K] less each label's entry at y_i, pairwise P [M, rows or 1, E, K, K] less each
        edge's entry at y_i (tables shared by the rows as they are), and the score of y_i under them [M, rows] (0
        but for shared tables). The smoothed max less the score is unchanged (each factor's marginals sum to 1), but
        neither term is the size of a whole labelling's score any more: in float32 at corel5k's shape (374 labels)
        the two cancelled to within about 1e-4 of each example's loss, the gradient's marginals lost as much, and
        L-BFGS stalled near its optimum (13-29 evaluations a step). Shared tables are not shifted (no per-row
        copy): a constant shift, such as each table's largest entry, would put -w on every (0, 0) edge of
        Finley-Joachims' tables (0 but at (1, 1)), whose sparse rows' scores are small as they are."""
        y, K = self.y[rows], self.K
        M, E = U.shape[0], self.edges.shape[0]
        U = U - U.gather(-1, y.expand(M, *y.shape).unsqueeze(-1))
        state = self._edge_states(rows)
        if P.shape[1] == 1:  # shared tables: index [M, E K K] (its gradient is E K K numbers, not rows of them)
            return U, P, P.reshape(M, E * K * K)[:, torch.arange(E, device=y.device) * K * K + state].sum(-1)
        P = P - P.flatten(-2).gather(-1, state.expand(M, *state.shape).unsqueeze(-1)).unsqueeze(-1)
        return U, P, U.new_zeros(U.shape[:2])

    def _edge_states(self, rows: slice) -> torch.Tensor:
        """[rows, E] long: the entry y_a K + y_b of each edge (a, b)'s flattened table at the examples' labels
        (index_select on int16: 4x faster than on int64)."""
        small, edges = self.y_small[rows], self.edges
        return (small.index_select(1, edges[:, 0]) * self.K + small.index_select(1, edges[:, 1])).long()

    def _sum(self, per_example: torch.Tensor, rows: slice) -> torch.Tensor:
        """(1/N_m) sum_{i in rows} mask_mi t_mi [M] of per-example terms [M, rows]."""
        return (per_example * self.mask[:, rows]).sum(1) / self.count

    def _max_of(self, rows: slice, on: torch.Tensor | None) -> SmoothedMax:
        """The smoothed max of examples ``rows`` of the models where ``on`` [M] (None: all)."""
        smax, total = self.smoothed_max, len(self.y)
        if hasattr(smax, "chunk") and self.chunk_rows < total:
            return smax.chunk(rows, total, on)
        return smax if on is None or not hasattr(smax, "subset") else smax.subset(on)

    def objective(self) -> torch.Tensor | Iterator[torch.Tensor]:
        """The smoothed objective [M] at the current eps (differentiable): one tensor, or, over several chunks of
        examples, the terms that sum to it (``optim.ModelSlices.value_and_grad`` streams them). Only the models in
        ``self.evaluated`` [M] run the (costly) smoothed max; the others get their data term without it (their
        values are placeholders: they are not moving)."""
        terms = self._terms()
        return sum(terms) if self.chunk_rows == len(self.y) else terms

    def _terms(self) -> Iterator[torch.Tensor]:
        yield self.regularizer()
        on = self.evaluated
        every = bool(on.all())
        for k, rows in enumerate(self.chunks()):
            if k and self.interruptible and out_of_time():
                raise OutOfTime(f"the time budget was spent after {k} of {len(self.chunks())} chunks of examples")
            U, P, score = self._relative(*lift_models(self.energy(self.x[rows]), self.num_models), rows)
            smax = self._max_of(rows, None if every else on)
            if every:
                value = smax(Potentials(U + self.delta[rows], P, self.energy.graph), self.eps[:, None])
            else:
                some = smax(Potentials(U[on] + self.delta[rows], P[on], self.energy.graph), self.eps[on, None])
                value = U.new_zeros(U.shape[:2]).index_put((on.nonzero()[:, 0],), some)
            yield self._sum(value - score, rows)

    def write_back(self) -> None:
        """Copy the parameters into ``target`` (the energy passed in) when the objective works on a copy."""
        if self.energy is not self.target:
            with torch.no_grad():
                for p, q in zip(self.target.parameters(), self.params):
                    p.copy_(q)

    # ------------------------------------------------------------------ certificate
    def certify(self) -> GapInfo:
        """The duality gap [M] at the current parameters (``certificate``: raises on a negative or non-finite
        one), streamed over the chunks of examples; sets ``self.last`` and ``self.smoothing``."""
        self.last, _, self.smoothing, _, _ = self._gap()
        return self.last

    def _gap(self, keep_logits: bool = False, keep_pairs: bool = False
             ) -> tuple[GapInfo, DualPoint, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The certificate at the current parameters: the gap [M], its dual point, the smoothing term eps/N sum_i
        H(mu_i) [M], with ``keep_logits`` the logits [M, N, n] (float32) of the labels' state-1 marginals, and with
        ``keep_pairs`` the logs [M, N, E, K^2] (float32) of the edges' pairwise marginals (else None)."""
        grads, data, dual_lin, entropy, kept = None, 0.0, 0.0, 0.0, ([], [])
        for rows in self.chunks():
            g, d, lin, h, *marginals = self._certify_chunk(rows, keep_logits, keep_pairs)
            grads = g if grads is None else [a if b is None else a.add_(b) for a, b in zip(grads, g)]
            data, dual_lin, entropy = data + d, dual_lin + lin, entropy + h
            for out, m in zip(kept, marginals):
                if m is not None:
                    out.append(m)
        with torch.no_grad():
            point = DualPoint(dual_lin, list(grads))
            primal = self.regularizer() + data
            info = certificate(primal, self.dual_value(point), self.tol, "lbfgs", primal.dtype)
        logits, pairs = (torch.cat(out, 1) if out else None for out in kept)
        return info, point, entropy, logits, pairs

    def dual_value(self, point: DualPoint) -> torch.Tensor:
        """D(mu) [M] of a dual point: its linear term less lambda/2 |w(mu)|_R^2 (in the point's dtype)."""
        kept = [(w, 1.0 / r) for w, r in zip(point.w, self._reg_weight) if w is not None]
        return point.linear - 0.5 * self.lam.to(point.linear) * self._squares(*zip(*kept))

    def _certify_chunk(self, rows: slice, keep_logits: bool = False, keep_pairs: bool = False
                       ) -> tuple[list[torch.Tensor | None], torch.Tensor, torch.Tensor, torch.Tensor,
                                  torch.Tensor | None, torch.Tensor | None]:
        """Examples ``rows``' share of the certificate: lambda w(mu) summed over them (per parameter), their
        (1/N_m) sums [M] of the data term, of the dual's linear term and of eps H(mu_i), with ``keep_logits``
        the logits [M, rows, n] (float32) of the labels' state-1 marginals, and with ``keep_pairs`` the logs
        [M, rows, E, K^2] (float32) of the edges' pairwise marginals (else None)."""
        graph = self.energy.graph
        U, P, score = self._relative(*lift_models(self.energy(self.x[rows]), self.num_models), rows)
        Ud = U.detach().requires_grad_()
        Pd = P.detach().expand(U.shape[0], U.shape[1], *P.shape[2:]).clone().requires_grad_()
        aug = Potentials(Ud + self.delta[rows], Pd, graph)
        value = self._max_of(rows, None)(aug, self.eps[:, None])
        mu_u, mu_p = torch.autograd.grad(value.sum(), (Ud, Pd))
        weight = self.mask[:, rows] / (self.lam * self.count)[:, None]
        inner = score - (U * mu_u).sum((-1, -2)) - (P * mu_p).sum((-1, -2, -3))  # <theta, m(y_i) - mu_i>
        grads = torch.autograd.grad((inner * weight).sum(), self.params, allow_unused=True)
        with torch.no_grad():
            score = score.detach()
            entropy = value - (aug.unary * mu_u).sum((-1, -2)) - (Pd * mu_p).sum((-1, -2, -3))  # eps H(mu_i)
            if self.fixed_eps:  # <Delta, mu> + eps H(mu) = smoothed value - <theta, mu>
                data, dual_lin = value - score, (self.delta[rows] * mu_u).sum((-1, -2)) + entropy
            else:
                top = value if self.exact_max is None else self.exact_max(aug)
                data, dual_lin = top - score, (self.delta[rows] * mu_u).sum((-1, -2))
            logits = torch.special.logit(mu_u[..., 1].clamp(0.0, 1.0)).float() if keep_logits else None
            pairs = mu_p.flatten(-2).clamp_min(0.0).log().float() if keep_pairs else None
            return (list(grads), self._sum(data, rows), self._sum(dual_lin, rows), self._sum(entropy, rows), logits,
                    pairs)

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        """A parameter-shaped tensor with (or without) a leading [M] dim as [M, -1]."""
        return t.reshape(1 if self.num_models is None else t.shape[0], -1)

    def _squares(self, tensors: Iterable[torch.Tensor], weights: Iterable[float]) -> torch.Tensor:
        """sum_k weight_k |t_k|^2 [M] per model (in the tensors' dtype) of parameter-shaped tensors, without a
        parameter-sized temporary (``_rows``)."""
        terms = [r * SquaredRows.apply(self._rows(t)) for t, r in zip(tensors, weights)]
        return sum(terms[1:], terms[0]) if terms else torch.zeros_like(self.lam)

    def _pieces(self, old: list[torch.Tensor | None], new: list[torch.Tensor | None]
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor, float]]:
        """(a, b - a, r) over pieces [M, c] of at most ``ROW_CHUNK_ELEMENTS`` elements of every parameter with a
        data term: a a view of ``old`` (float64), b - a a float64 temporary, r the parameter's regulariser weight."""
        for a, b, r in zip(old, new, self._reg_weight):
            if b is None:
                continue
            A, B = self._rows(a), self._rows(b)
            width = max(1, ROW_CHUNK_ELEMENTS // A.shape[0])
            for start in range(0, A.shape[1], width):
                piece = A[:, start:start + width]
                yield piece, B[:, start:start + width].double() - piece, r


@dataclass
class DualPoint:
    """What the dual D(mu) of a certificate's marginals mu needs, both linear in mu: the linear term [M] (the margin
    (1/N) sum_i <Delta, mu_i>, plus eps H(mu_i) at a fixed eps, concave in mu) and w(mu) = (1/(lambda N)) sum_i
    (phi(y_i) - E_mu_i phi), in the metric of the regulariser, per parameter (None: a parameter without data term)."""

    linear: torch.Tensor
    w: list[torch.Tensor | None]


@dataclass
class BestPoint:
    """The lowest primal [M] certified so far with its parameters [M, P], and the highest dual [M] (float64): that of
    the certificates' mixed dual point (``SmoothedLBFGS.mix_dual``), which is at least every single one's."""

    primal: torch.Tensor
    dual: torch.Tensor
    params: torch.Tensor

    def update(self, primal: torch.Tensor, dual: torch.Tensor, slices: ModelSlices) -> None:
        """Take a certificate's primal [M] at the current parameters of ``slices`` (copied in place where it is at
        most the lowest so far) and a dual [M]."""
        slices.read(self.params, (primal <= self.primal).to(self.params.device))
        self.primal = torch.minimum(primal, self.primal)
        self.dual = torch.maximum(dual, self.dual)


def history_that_fits(params: list[torch.Tensor], history_size: int) -> int:
    """``history_size`` L-BFGS curvature pairs, or fewer (at least 1) where ``HISTORY_MEMORY_SHARE`` of the memory
    available on the parameters' device holds fewer (logged)."""
    count = sum(p.numel() for p in params)
    pair = 2 * count * params[0].element_size()
    free = available_memory(params[0].device)
    fits = history_size if free is None else max(1, int(HISTORY_MEMORY_SHARE * free // pair))
    if fits < history_size:
        log.info(f"L-BFGS keeps {fits} curvature pairs instead of {history_size}: a pair is {pair / 2**30:.2f} GiB "
                 f"({count:,} parameters x 2) and {free / 2**30:.1f} GiB are available")
    return min(history_size, fits)


class SmoothedLBFGS(SmoothedHinge):
    """Full-batch L-BFGS on the smoothed structured hinge (or CRF likelihood), with a duality-gap certificate
    and continuation on the temperature (eps=None). Args as ``SmoothedHinge``, and ``history_size``: the L-BFGS
    memory. The energy's parameters are optimised in place from their current values."""

    def __init__(self, energy: Energy, x: torch.Tensor, y: torch.Tensor, lam: float | torch.Tensor,
                 smoothed_max: SmoothedMax = tree_smoothed_max, exact_max: Callable | None = None,
                 margin_scale: float = 1.0, bias_reg: float = 1e-4, tol: float = 1e-3, eps: float | None = None,
                 mask: torch.Tensor | None = None, history_size: int = 20, dtype: torch.dtype = torch.float64
                 ) -> None:
        super().__init__(energy, x, y, lam, smoothed_max, exact_max, margin_scale, bias_reg, tol, eps, mask, dtype)
        self.iterations = 0
        self.until: int | None = None  # the iteration cap of the running ``fit`` (progress lines)
        # streamed even over one chunk: the regulariser's gradient and the data term's are not made at once
        self.opt = BatchedLBFGS(self.params, self._terms, self.num_models, history_that_fits(self.params,
                                                                                             history_size))
        self.best: BestPoint | None = None  # the lowest primal certified so far, and the highest dual
        self.mixed: DualPoint | None = None  # the best combination of the certificates' dual points (``mix_dual``)
        self.moved = False  # parameters restored since the optimizer's last evaluation
        self.stepped_from: torch.Tensor | None = None  # [M, P]: where a block step moved from (``moved_biases``)

    def run(self, iterations: int) -> None:
        """Up to ``iterations`` L-BFGS iterations on the smoothed objective; models already certified stay
        put, and models whose line search stalls wait for the next ``certify`` (which lowers eps)."""
        active = torch.ones_like(self.eps, dtype=torch.bool) if self.last is None else ~self.last.converged.to(
            self.eps.device)
        if not torch.equal(active, self.evaluated) or self.moved:  # certified models drop out of the evaluations
            step = self.stepped_from if torch.equal(active, self.evaluated) else None  # the same objective
            self.evaluated, self.moved, self.stepped_from = active.clone(), False, None
            self.opt.refresh(step)
        self.interruptible = True
        try:
            for _ in range(iterations):
                if not bool(active.any()):
                    break  # every model certified or stalled at this temperature: time to certify again
                active &= ~self.opt.step(active)
                self.iterations += 1
                if not tick(self.iterations, self.until, "L-BFGS iterations", self._gap_note):
                    break  # the run's time budget is spent
        except OutOfTime:  # within a streamed evaluation: the step was dropped, the parameters are its start
            pass
        finally:  # also when interrupted (Ctrl-C): the energy holds the iterations done
            self.interruptible = False
            self.write_back()

    def certify(self) -> GapInfo:
        """The duality gap [M] of the current parameters against the dual of the best combination of every
        certificate's dual point so far (``mix_dual``: each is a lower bound on the optimum, whatever the parameters
        are now); lowers eps (continuation) where this certificate's own gap is within twice the smoothing term.
        Where the energy has a ``label_bias``, a second dual point comes from the parameters with the biases moved
        to zero their gradient (``moved_biases``); with a fixed eps (a CRF) that pass is taken at every certificate,
        a third from there with the edges' biases moved too, and the iterate takes the lower of the two points where
        its objective falls there. Sets ``self.last`` and ``self.best``."""
        bias = self.energy.label_bias() if self.K == 2 else None
        keep = bias is not None and self.lam.numel() * self.y.numel() <= BIAS_MOVE_ELEMENTS
        info, point, self.smoothing, logits, _ = self._gap(keep_logits=keep)
        primal = info.primal
        with torch.no_grad():
            mixed = self.mix_dual(point).to(info.dual)
            if keep and not self.fixed_eps:  # the moved biases lift D by about their share of it: take that pass
                k = self._index(bias)  # where it could certify
                share = 0.5 * self.lam * self._squares([point.w[k]], [1.0 / self._reg_weight[k]])
                reach = info.primal - mixed - share.to(mixed) <= BIAS_MOVE_REACH * self.tol * info.primal.abs()
                keep = bool(reach.any())
        del point  # one parameter-sized dual point at a time; both at this temperature
        if keep:
            below = primal if self.fixed_eps else None  # a fixed eps: the iterate moves where that lowers the objective
            moved_primal, moved = self.moved_biases(bias, logits, below)
            with torch.no_grad():
                for point in moved:
                    mixed = self.mix_dual(point).to(info.dual)
                if below is not None:  # the models that took the moved biases (``moved_biases``' rule)
                    primal = torch.where(moved_primal < below, moved_primal, primal)
        open_ = ~info.converged.to(self.eps.device)
        if not self.fixed_eps and bool(open_.any()):
            self._lower_eps(info.gap.to(self.eps), info.primal.to(self.eps), self.smoothing, open_)
        with torch.no_grad():
            if self.best is None:
                self.best = BestPoint(primal, mixed, self.opt.slices.flat())
            else:
                self.best.update(primal, mixed, self.opt.slices)
        self.last = certificate(primal, self.best.dual, self.tol, "lbfgs", self.params[0].dtype)
        return self.last

    def take_progress(self, old: SmoothedLBFGS) -> None:
        """Go on from ``old``, a fit of the same problem in another precision whose parameters the energy now holds
        (``old.write_back()``): its temperatures, iteration count, last certificate, lowest certified primal (with
        its parameters, cast) and mixed dual point (float64 in either: a lower bound whatever the precision), and
        the warm-start messages of a smoothed max that keeps them (``LPSmoothedMax``). The L-BFGS memory starts
        empty."""
        dtype = self.params[0].dtype
        self.eps = old.eps.to(self.eps)
        self.iterations, self.last, self.smoothing, self.mixed = old.iterations, old.last, old.smoothing, old.mixed
        if old.best is not None:
            self.best = BestPoint(old.best.primal, old.best.dual, old.best.params.to(dtype))
        messages = getattr(old.smoothed_max, "messages", None)
        if messages is not None and hasattr(self.smoothed_max, "messages"):
            self.smoothed_max.messages = messages.to(dtype)

    def moved_biases(self, bias: torch.Tensor, logits: torch.Tensor, below: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, list[DualPoint]]:
        """The primal [M] and the dual points of the current parameters with the labels' biases ``bias`` [(M,) n]
        moved by ``label_bias_shift`` from the marginals' ``logits`` [M, N, n]; with ``below``, where the energy has
        an ``edge_bias`` whose pairwise marginals fit in ``PAIR_MOVE_ELEMENTS``, also of that point with the edges'
        biases then moved by ``pair_bias_shift`` from its pairwise marginals. The dual pays |gradient of a
        bias|^2 / (2 lambda bias_reg): with bias_reg 1e-4, L-BFGS's iterates leave D far below P long after the
        primal has settled (FixedTree on delicious: 64.7 of the dual's quadratic term on the biases, 0.70 on the
        input weights), and these points lift it (mixed in by ``mix_dual``). The parameters are left as they were,
        but for the models whose lowest primal among these points is below ``below`` [M] (a fixed eps: the objective
        L-BFGS minimises): those take that point, a block step on the biases (a CRF's L-BFGS on delicious left each
        row's marginals summing to 14.6 labels where the rows have 19.2, and its test example F1 at 9.5 instead of 23;
        at delicious' shape the edges' move after 100 iterations lowered P from 69.987 to 69.945, where 100 more
        iterations reach 69.949). Returns the lowest of those primals [M] and the points."""
        table = self.energy.edge_bias() if below is not None else None
        if table is not None and self.lam.numel() * len(self.y) * self.edges.shape[0] * self.K**2 > PAIR_MOVE_ELEMENTS:
            table = None
        blocks = [bias] if table is None else [bias, table]
        start = None if below is None else self.opt.slices.flat()
        with torch.no_grad():
            kept = [p.clone() for p in blocks]
            b = self._rows(bias)
            shift = label_bias_shift(logits, self.y, self._weight(), b, self.lam * self._reg_weight[self._index(bias)],
                                     self.eps)
            bias.copy_((b.double() + shift).to(bias).reshape(bias.shape))
        try:
            info, point, _, _, pairs = self._gap(keep_pairs=table is not None)
            primals, points, moved = [info.primal], [point], [[p.clone() for p in blocks]]
            if table is not None:
                with torch.no_grad():
                    t = self._rows(table).reshape(pairs.shape[0], -1, self.K ** 2)
                    states = torch.cat([self._edge_states(rows) for rows in self.chunks()])
                    shift = pair_bias_shift(pairs, states, self._weight(), t,
                                            self.lam * self._reg_weight[self._index(table)], self.eps)
                    del pairs
                    table.copy_((t.double() + shift).to(table).reshape(table.shape))
                info, point = self._gap()[:2]
                primals.append(info.primal)
                points.append(point)
                moved.append([p.clone() for p in blocks])
        except BaseException:  # also when interrupted (Ctrl-C): the iterate as it was
            with torch.no_grad():
                for p, k in zip(blocks, kept):
                    p.copy_(k)
            raise
        with torch.no_grad():
            lowest, which = torch.stack(primals).min(0)
            take = torch.zeros_like(lowest, dtype=torch.bool) if below is None else lowest < below
            for i, p in enumerate(blocks):  # [M] against each block [(M,) ...]
                value = kept[i]
                for j, point_blocks in enumerate(moved):
                    value = torch.where((take & (which == j)).to(p.device).reshape(-1, *[1] * (p.dim() - 1)),
                                        point_blocks[i], value)
                p.copy_(value)
            if bool(take.any()):  # the iterate moved: L-BFGS re-evaluates there, the move one more curvature pair
                self.stepped_from = None if self.moved else start
                self.moved = True
                self.write_back()
        return lowest, points

    def _weight(self) -> torch.Tensor:
        """The examples' weights mask / N_m [M, N] in the data term."""
        return self.mask / self.count[:, None]

    def _index(self, param: torch.Tensor) -> int:
        """The position in ``self.params`` of ``param`` or of the parameter it is a view of (by identity)."""
        return next(i for i, p in enumerate(self.params) if p is param or param._base is p)

    def mix_dual(self, new: DualPoint) -> torch.Tensor:
        """Move ``self.mixed`` to (1 - gamma) mixed + gamma ``new``, gamma in [0, 1] per model by exact line search,
        and return its D [M] (>= both ends'). D is concave in mu (a linear term less a quadratic in w(mu), both linear
        in mu) and the marginal polytope is convex, so the combination is a dual point too (at a fixed eps the
        mixed linear term under-counts the concave entropy: still a lower bound). The duals of single certificates
        stall where the iterates oscillate at a low temperature: MAM on birds held D at 6.880 for 1000
        iterations (P 6.954); mixed, D rose to 6.920 in as many (6.943 after 40 epochs). Kept in float64
        (rounding must not drift the combination over thousands of certificates of a float32 solve)."""
        linear = new.linear.double()
        if self.mixed is None:
            copies = [None if w is None else w.to(torch.float64, memory_format=torch.contiguous_format, copy=True)
                      for w in new.w]  # contiguous: mixed in place through ``_pieces``' views
            self.mixed = DualPoint(linear, copies)
            return self.dual_value(self.mixed)
        old, lam = self.mixed, self.lam.double()
        curvature, cross = torch.zeros_like(lam), torch.zeros_like(lam)  # |d|_R^2 and <a, d>_R, d = new w - old w
        for a, d, r in self._pieces(old.w, new.w):  # in pieces: w is parameter-sized (MAM at rcv1's shape: 2.3 GB)
            curvature += (d * d).sum(1) / r
            cross += (a * d).sum(1) / r
        curvature, slope = lam * curvature, linear - old.linear - lam * cross  # -D'' along the segment, D'(0)
        gamma = (slope / curvature.clamp_min(torch.finfo(torch.float64).tiny)).clamp(0.0, 1.0)
        gamma = torch.where(curvature > 0, gamma, (slope > 0).to(gamma))
        for a, d, _ in self._pieces(old.w, new.w):
            a.add_(d.mul_(gamma[:, None]))
        old.linear = old.linear + gamma * (linear - old.linear)
        return self.dual_value(old)

    def start_near_optimum(self, objective: torch.Tensor) -> None:
        """For parameters that start near the optimum, whose objective is about ``objective`` [M] (a warm start):
        lower each model's temperature so that its smoothing term (measured on the first chunk of rows) is at most
        half of that, so that the first iterations refine the start rather than pull it towards a high temperature's
        smoothed optimum (Full started at Independent's solution, at eps = 1, lost its accuracy within 20
        iterations)."""
        if self.fixed_eps:
            return
        rows = self.chunks()[0]
        smoothing = self._certify_chunk(rows)[3] * self.count / self.mask[:, rows].sum(1).clamp_min(1)
        tiny = torch.finfo(self.eps.dtype).tiny
        ratio = 0.5 * objective.to(self.eps).clamp_min(tiny) / smoothing.to(self.eps).clamp_min(tiny)
        self.eps = self.eps * ratio.clamp(1e-3, 1.0)
        self.opt.forget(torch.ones_like(self.eps, dtype=torch.bool))
        self.last, self.moved = None, True

    @property
    def uncertified(self) -> bool:
        """Whether some model is not certified at the last certificate (False before the first one)."""
        return self.last is not None and self.best is not None and not bool(self.last.converged.all())

    def behind(self) -> torch.Tensor:
        """bool [M]: the models whose lowest certified primal is below their last one (their parameters there are
        ``best.params``' rows)."""
        return (self.best.primal < self.last.primal).to(self.eps.device)

    def restore_best(self) -> GapInfo:
        """Put back, for each model whose lowest certified primal is below its current one, the parameters of that
        primal (a run that ends uncertified, e.g. mid-way through a lower temperature, keeps its best point);
        returns and sets their certificate against the highest dual (``certify`` took the last point into
        ``best``, so its primal is the lowest)."""
        back = self.behind()
        if bool(back.any()):
            self.opt.slices.set(self.best.params, back)
            self.opt.forget(back)
            self.moved = True
            self.write_back()
        self.last = certificate(self.best.primal, self.best.dual, self.tol, "lbfgs", self.params[0].dtype)
        return self.last

    def _lower_eps(self, gap: torch.Tensor, primal: torch.Tensor, smoothing: torch.Tensor, open_: torch.Tensor
                   ) -> None:
        """Continuation on each model's temperature: gap, primal and the smoothing term eps/N sum_i H(mu_i)
        [M] (the gap at the smoothed optimum is below it); ``open_`` [M]: models not yet certified. Where
        that term is at least half the gap (the smoothed problem is nearly solved), eps shrinks 2-10x
        towards the eps whose smoothing term would be tol/2 of the primal, and that model's L-BFGS memory
        is dropped (its objective changed)."""
        lower = open_ & (smoothing >= 0.5 * gap)
        if not bool(lower.any()):
            return
        aim = 0.5 * self.tol * primal.abs() / smoothing.clamp_min(torch.finfo(gap.dtype).tiny)
        self.eps = torch.where(lower, self.eps * aim.clamp(0.1, 0.5), self.eps)
        self.opt.reset(lower)

    def fit(self, max_iter: int = 10000, check_every: int = 20, restore: bool = True) -> GapInfo:
        """Run until every model is certified (relative gap <= tol), ``max_iter`` iterations, or the run's time
        budget is spent (``progress.time_budget``); an uncertified model then goes back to its best certified point
        (``restore_best``), unless ``restore`` is False: a fit resumed by the next call (one per training epoch) goes
        on from where it is, as a restored point would undo each call's progress on the smoothed objective (a
        resumed FixedTree went back to its lowest primal at every epoch and held one temperature for 10,000
        iterations)."""
        info, idle, self.until = self.certify(), 0, max_iter
        while not bool(info.converged.all()) and self.iterations < max_iter and idle < 2 and not out_of_time():
            before = self.iterations
            self.run(min(check_every, max_iter - self.iterations))
            idle = idle + 1 if self.iterations == before else 0  # stalled even after a new temperature: give up
            info = self.certify()
        return info if bool(info.converged.all()) or not restore else self.restore_best()

    def solve(self, iterations: int | None = None) -> SmoothedLBFGS:
        """``fit()`` to the certificate (None), or exactly ``iterations`` L-BFGS iterations and a certificate of
        where they end (``last``); returns the solver."""
        if iterations is None:
            self.fit()
        else:
            self.run(iterations)
            self.certify()
        return self

    def _gap_note(self) -> str:
        """The last certificate, for progress lines."""
        if self.last is None:
            return ""
        return f"last relative duality gap {float(self.last.relative_gap.max()):.2g}, tol {self.tol:g}"
