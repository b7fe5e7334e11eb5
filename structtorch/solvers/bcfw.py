"""Block-coordinate Frank-Wolfe in the dual of the structured SVM (Lacoste-Julien et al., ICML 2013),
in marginal form, for energies linear in their parameters.

Primal (what every hinge learner minimises, biases regularised with weight ``bias_reg``):

    P(w) = lambda/2 (|W|^2 + rho |b|^2) + (1/N) sum_i H_i(w),
    H_i(w) = max_y [score(x_i, y; w) + Delta(y_i, y)] - score(x_i, y_i; w),
    Delta = margin_scale * Hamming (margin="hamming") or margin_scale * [y != y_i] (margin="zero_one").

For a linear energy score(x, y; w) = <pot(x; w), m(y)> with m(y) the one-hot marginals (unary
[n, K], pairwise [E, K, K]), so the dual variable of example i is a point mu_i of the marginal
polytope and

    w(mu) = 1/(lambda N) R^-1 grad_w sum_i <pot(x_i; w), m(y_i) - mu_i>   (R = diag(1, rho on biases)),
    D(mu) = -lambda/2 |w(mu)|_R^2 + (1/N) sum_i l_i,

with l_i the expected loss Delta(y_i, .) of the convex combination of assignments mu_i stands for
(Hamming: l_i = <delta_i, mu_i>, delta_i = Delta(y_i, .) per state; 0/1: 1 - its weight on y_i).
P(w) >= D(mu) for every w and mu, and P(w(mu)) - D(mu) = sum_i g_i (the block Frank-Wolfe gaps). The
solver keeps nu_i = m(y_i) - mu_i and l_i (zero at the start, w = 0), so the per-example state starts at
zeros and needs no labels.

Ensembles of T trees (RTA): the score is the mean of the trees' scores (``ensemble_map``), so the
pairwise parts are flattened to one list of T (n-1) edges scaled by 1/T (``lift_models``); the dual
state and the energy's ``block_gram`` use that layout, and the oracle gets the ensemble back.

Blocks are (example, connected component of the label graph): the marginal (and local) polytope of
a forest factorises over components, so each gets its own exact line search (for Independent this
is exactly dual coordinate descent, one binary SVM per label). A batch
calls the oracle once, then picks the blocks' steps gamma in [0, 1] by Gauss-Seidel sweeps on the
batch's exact dual quadratic (its Gram from the energy's ``block_gram``; ``steps="block"``), and
ends with one exact line search along the combined direction; ``steps="batch"`` uses the plain
batch Frank-Wolfe direction with one line search. Both increase D monotonically.

Pairwise steps (``active_set=S``, Osokin et al., ICML 2016): each example keeps up to S labellings with weights
(``ActiveSets``), and a block's direction goes from its "away" atom (the held labelling of least loss-augmented
score, or the residual part of mu_i not held as labellings) to the oracle's vertex, with the away atom's weight as
the largest step. Frank-Wolfe steps shrink every atom at once and zig-zag near the optimum; pairwise steps remove
a bad labelling's weight outright (RTA on birds: relative gap 1.4e-3 after 400 passes, where Frank-Wolfe steps had
8.0e-3 and needed about 3,000). Needs one block per example and an oracle that returns labellings.

The liblinear convention: a regularised bias of weight rho equals a constant feature 1/sqrt(rho)
with a free bias weight; as rho -> 0 it approaches the unregularised bias (libsvm SVC). The
certified gap is on the rho-regularised objective.

Weighted averaging (``averaging=True``, Lacoste-Julien et al. Sec. 4): the certified point is the
average w_avg^(k+1) = k/(k+2) w_avg^(k) + 2/(k+2) w^(k+1) of the iterates, with the same average of the
dual state (mu_avg, a convex combination, so still in the polytope, and w_avg = w(mu_avg) by linearity),
so P(w_avg) - D(mu_avg) is the averaged point's own duality gap. The energy then holds w_avg between
steps (what predicts and is certified); the iterate is kept in the solver state. k counts the steps each
model took (a certified model stops moving and averaging).

Oracles: ``tree_oracle`` (exact, trees and forests): the gap certifies the exact objective.
margin="zero_one" calls the oracle with ``exclude=y_i`` (the worst violator: the best assignment other
than y_i; ``tree_oracle`` and ``ensemble_oracle`` support it) and compares it with y_i itself.
``ensemble_oracle`` (RTA): exact where Lemma 7 certifies its K-best search, so the gap is a certificate
when every search of the gap pass was certified (the oracle counts them).
``smoothed_oracle`` (loopy graphs): its marginals lie in the local polytope and its value
upper-bounds the LP-relaxed loss-augmented max, so the gap certifies the LP-relaxed objective,
up to the smoothing (the certified gap cannot fall below about eps * entropy).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from ..energies import Energy
from ..graph import Graph, check_bool, check_float, check_int, component_labels
from ..inference import fused, smoothed_lp, tree_kbest, tree_map
from ..inference.backends import fused_active
from ..inference.kbest import ensemble_search
from ..losses import hamming_margin
from ..potentials import Potentials
from .active_set import ActiveSets, labelling_scores, pair_index, weighted_marginals
from .certificate import GapInfo, certificate

__all__ = ["BCFW", "GapInfo", "Oracle", "StepInfo", "one_hot_marginals", "smoothed_oracle", "tree_oracle"]

#: loss-augmented Potentials [*B] -> (value [*B], maximiser marginals unary [*B, n, K], pairwise [*B, E, K, K]);
#: the value is the max or an upper bound on it (the certificate's primal); margin="zero_one" also passes
#: ``exclude=y`` [*B, n] (then: the best assignment other than y)
Oracle = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def one_hot_marginals(y: torch.Tensor, graph: Graph, num_states: int, dtype: torch.dtype
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """m(y): unary [*B, n, K] and pairwise [*B, E, K, K] one-hot marginals of assignments y [*B, n]
    (ensembles: E = T (n-1), the trees' edges one after the other, as ``lift_models`` lays them out)."""
    oh = torch.nn.functional.one_hot(y, num_states).to(dtype)
    e = graph.edges.reshape(-1, 2).to(y.device)
    return oh, oh[..., e[:, 0], :, None] * oh[..., e[:, 1], None, :]


def tree_oracle(pot: Potentials, exclude: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact max on a tree/forest: (value [*B], one-hot marginals of the argmax [*B, n, K], [*B, E, K, K]);
    with ``exclude`` [*B, n], the max over assignments other than it (``tree_kbest`` with k = 1)."""
    with torch.no_grad():
        if exclude is None:
            value, y = tree_map(pot)
        else:
            scores, ys = tree_kbest(pot, 1, exclude)
            value, y = scores[..., 0], ys[..., 0, :]
    return (value, *one_hot_marginals(y, pot.graph, pot.num_states, pot.dtype))


def smoothed_oracle(eps: float, iters: int, tol: float | None = None) -> Oracle:
    """Oracle from ``smoothed_lp`` (any graph): (value [*B], pseudo-marginals [*B, n, K], [*B, E, K, K]).

    The value upper-bounds the LP relaxation of the max, so the BCFW gap certifies the LP-relaxed
    objective up to the smoothing.
    """
    def oracle(pot: Potentials) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            res = smoothed_lp(pot, eps=eps, iters=iters, tol=tol)
        return res.value, res.unary, res.pairwise
    return oracle


class EnsembleOracle:
    """``ensemble_search`` as an oracle (RTA): the best candidate of the K-best lists of an ensemble's trees,
    k doubling up to ``k_max`` where Lemma 7 does not certify it; ``exclude`` gives the worst violator. Its
    value is Lemma 7's upper bound on the max (the candidate's score where certified), so the primal and the
    gap stay upper bounds whatever the search found; uncertified searches make the gap looser, never wrong.

    Where few rows certify at the small K, doubling from k costs more than starting higher: every ``EXPLORE``-th
    call starts at k, and the calls between start at the rung of the ladder k, 2k, ..., k_max that would have cost
    that call least (a round's cost taken as its K times its rows; ``cheapest_start``). A search started higher
    certifies every row that one started at k certifies (its lists contain the shorter ones and its bound is
    lower), with an answer of the same score, so only the time and the ties change.

    ``exact``: every assignment is scored instead (``ensemble_enumerate``): each search certified, K used 0.

    Counts, since the last ``reset``, the searches, the certified ones and the K they used (``stats``).
    """

    #: every EXPLORE-th call starts at k, to see again where the rows certify
    EXPLORE = 16

    def __init__(self, k: int, k_max: int | None = None, exact: bool = False) -> None:
        self.k, self.k_max, self.exact = k, k_max, exact
        self.ladder = [k]
        while k_max is not None and self.ladder[-1] < k_max:
            self.ladder.append(min(2 * self.ladder[-1], k_max))
        self.start, self.calls = k, 0
        self.reset()

    def reset(self) -> None:
        self.searches, self.certified, self.k_total = 0, 0, 0

    @contextmanager
    def uncounted(self) -> Iterator[None]:
        """Searches in this context leave the counts as they were."""
        counts = self.searches, self.certified, self.k_total
        try:
            yield
        finally:
            self.searches, self.certified, self.k_total = counts

    def stats(self) -> dict[str, float]:
        """{"certified": fraction of certified searches, "mean_k": their mean K} since the last reset."""
        n = max(self.searches, 1)
        return {"certified": self.certified / n, "mean_k": self.k_total / n}

    def cheapest_start(self, certified: torch.Tensor, k_used: torch.Tensor) -> int:
        """The rung to start at, from a search started at k: rows certified at rung r (``k_used``) need no round
        after r; starting at rung s costs ladder[s] for every row plus, for each later rung j, ladder[j] for the
        rows not certified before j. The lowest rung of least cost."""
        rung = torch.searchsorted(torch.tensor(self.ladder, device=k_used.device), k_used)
        rung = torch.where(certified, rung, len(self.ladder)).cpu()  # never certified: past the ladder
        need = [int((rung >= j).sum()) for j in range(len(self.ladder))]  # rows still searching at rung j
        costs = [self.ladder[s] * rung.numel() + sum(self.ladder[j] * need[j] for j in range(s + 1, len(self.ladder)))
                 for s in range(len(self.ladder))]
        return self.ladder[costs.index(min(costs))]

    def __call__(self, pot: Potentials, exclude: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        explore = self.calls % self.EXPLORE == 0
        with torch.no_grad():
            found = ensemble_search(pot, self.k if explore else self.start, self.k_max, exclude, self.exact)
        if explore and found.certified.numel():
            self.start = self.cheapest_start(found.certified, found.k_used)
        self.calls += 1
        self.searches += found.certified.numel()
        self.certified += int(found.certified.sum())
        self.k_total += int(found.k_used.sum())
        return (found.upper, *one_hot_marginals(found.y, pot.graph, pot.num_states, pot.dtype))


@dataclass
class StepInfo:
    """One BCFW step (M = number of models, 1 without a model dim).

    gap: [M] sum of the batch's block gaps at w before the step (each already divided by N_m).
    loss: [M] (1/N_m) sum of the batch's hinge losses at w before the step.
    step: [M] line-search step along the combined direction (0 for converged models).
    D(mu) after the step (non-decreasing) is ``BCFW.dual()``: not computed here, as no step needs it (a float64
    pass over every parameter: 11% of a step's time with RTA on delicious' 983 labels).
    """

    gap: torch.Tensor
    loss: torch.Tensor
    step: torch.Tensor


class BCFW:
    """Structured SVM solver with a certified duality gap; updates the energy's parameters in place.

    Args:
        energy: an ``Energy`` linear in its parameters (``FinleyJoachimsEnergy``, ``LinearTableEnergy``,
            ``TreeEnsembleEnergy``). With ``energy.num_models = M`` all models train at once. Its parameters
            are set to 0 (= w(mu) at the start mu_i = m(y_i)).
        num_examples: N, the size of the training set; batches carry example indices in [0, N).
        lam: lambda > 0, a float or a tensor [M] (one per model).
        oracle: loss-augmented Potentials -> (value, mu_unary, mu_pair); ``tree_oracle``, ``smoothed_oracle`` or
            ``EnsembleOracle`` (margin="zero_one": one that takes ``exclude=``).
        margin: "hamming" (Delta = Hamming distance, blocks = connected components of the label graph) or
            "zero_one" (Delta = [y != y_i], the worst violator from ``oracle(pot, exclude=y_i)``; blocks =
            examples).
        margin_scale: weight of the loss Delta (the margin).
        bias_reg: rho > 0, the regulariser weight of parameters named ``*bias`` relative to lambda.
        tol: relative duality gap at which a model is certified and stops moving.
        mask: bool [M, N] (or [N]), the examples each model trains on (CV folds); default all.
        steps: "block" (per-block steps from the batch's exact dual QP, needs ``energy.block_gram``) or
            "batch" (the batch Frank-Wolfe direction); both end with one exact line search.
        sweeps: Gauss-Seidel sweeps over the batch for steps="block".
        averaging: certify (and leave in the energy) the weighted average of the iterates instead of the
            last iterate.
        step_oracle: the steps' oracle (default ``oracle``), e.g. a cheaper inexact search: a worse mu_hat makes a
            step smaller, never wrong, and the certificate (``duality_gap``) always takes ``oracle``. Where a
            certificate's candidates show a relative gap above tol that the step oracle's on the same pass do not,
            the steps cannot close it: from then on they take ``oracle`` too (``escalated``).
        active_set: S > 0: pairwise steps with up to S labellings held per example (``ActiveSets``); 0: Frank-Wolfe
            steps. Needs one block per example (margin="zero_one", or a connected label graph) and oracles whose
            maximisers are labellings (``tree_oracle``, ``EnsembleOracle``; not ``smoothed_oracle``). "auto": S =
            ``AUTO_ACTIVE_SET`` (fewer where the sets would take more than ``ACTIVE_SET_BYTES``, or a batch row's
            pair indices more than ``ACTIVE_SET_PAIRS`` entries) where those hold, else Frank-Wolfe steps.

    State (per example, indexed by example index, so it can be swapped for a store object):
    ``nu_unary`` [N, M, n, K] and ``nu_pair`` [N, M, E, K, K], nu_i = m(y_i) - mu_i, and ``ell`` [N, M, C],
    the expected loss l_i per block, all zeros at the start (ensembles: E = T (n-1)); with averaging also
    their averages ``avg_unary``, ``avg_pair``, ``avg_ell``, the iterate's parameters ``iterate`` (the energy
    holds the average) and ``iterate_lin`` [M], and the per-model step counts ``avg_steps`` [M]. With an active set,
    the iterate's ``active_sets`` (labellings [N, M, S, n], weights [N, M, S]) and ``evictions``, the labellings
    evicted from a full set so far.
    """

    MARGINS = ("hamming", "zero_one")
    #: active_set="auto": at most this many labellings per example, in at most ACTIVE_SET_BYTES (labellings as
    #: bytes) and ACTIVE_SET_PAIRS pair indices per batch row (S T (n-1)); none where fewer than 2 would fit. The
    #: pairs' cap bounds the steps' extra work: RTA on delicious (983 labels, 10 trees) with 21 labellings, 2.1e5
    #: indices a row, went at 56 rows/s against Frank-Wolfe steps' 100; birds (32 labellings) has 5,760 a row
    AUTO_ACTIVE_SET, ACTIVE_SET_BYTES, ACTIVE_SET_PAIRS = 32, 2 ** 28, 2 ** 13
    #: ``start_at``: the smallest mix c of a starting dual point that is kept
    MIN_START_MIX = 0.01

    def __init__(self, energy: Energy, num_examples: int, lam: float | torch.Tensor, oracle: Oracle = tree_oracle,
                 margin_scale: float = 1.0, bias_reg: float = 1e-2, tol: float = 1e-3,
                 mask: torch.Tensor | None = None, steps: str = "block", sweeps: int = 3,
                 averaging: bool = False, margin: str = "hamming", step_oracle: Oracle | None = None,
                 active_set: int | str = 0) -> None:
        if not isinstance(energy, Energy):
            raise TypeError(f"energy must be a structtorch Energy, got {type(energy).__name__}")
        if margin not in self.MARGINS:
            raise ValueError(f"margin must be one of {self.MARGINS}, got {margin!r}")
        num_examples = check_int(num_examples, "num_examples", 1)
        margin_scale, bias_reg, tol = (check_float(v, name, 0.0) for name, v in
                                       (("margin_scale", margin_scale), ("bias_reg", bias_reg), ("tol", tol)))
        if steps not in ("block", "batch"):
            raise ValueError(f"steps must be 'block' or 'batch', got {steps!r}")
        if steps == "block" and not hasattr(energy, "block_gram"):
            raise TypeError(f"steps='block' needs {type(energy).__name__}.block_gram; use steps='batch'")
        sweeps = check_int(sweeps, "sweeps", 1)
        self.active_set = active_set if active_set == "auto" else check_int(active_set, "active_set", 0)
        self.averaging = check_bool(averaging, "averaging")
        self.energy, self.oracle, self.steps, self.sweeps, self.margin = energy, oracle, steps, sweeps, margin
        self.step_oracle = oracle if step_oracle is None else step_oracle
        self.escalated = False  # the steps took ``oracle`` after a certificate their own oracle was blind to
        self.num_models = energy.num_models
        self.num_examples, self.margin_scale, self.bias_reg, self.tol = num_examples, margin_scale, bias_reg, tol
        self.params = [p for _, p in energy.named_parameters()]
        self._bias_scale = [1.0 / bias_reg if n.endswith("bias") else 1.0 for n, _ in energy.named_parameters()]
        ref = self.params[0]
        M = 1 if self.num_models is None else self.num_models
        self.lam = check_lam(lam, M, ref)
        self.mask = check_mask(mask, M, num_examples, ref.device)
        self.count = self.mask.sum(1).to(ref.dtype)  # N_m
        self.scale = 1.0 / (self.lam * self.count)  # s_m = 1 / (lambda_m N_m)
        g = energy.graph  # ensembles: the components of the union of the trees' edges
        self.node_comp = torch.as_tensor(component_labels(g.num_nodes, g.edges.reshape(-1, 2).numpy()),
                                         dtype=torch.long, device=ref.device)
        self.num_comp = int(self.node_comp.max()) + 1
        if margin == "zero_one":  # the 0/1 loss couples the components: one block per example
            self.num_comp, self.node_comp = 1, torch.zeros_like(self.node_comp)
        self.edge_comp = self.node_comp[energy.graph.edges.reshape(-1, 2)[:, 0].to(ref.device)]
        if self.active_set not in (0, "auto") and self.num_comp != 1:
            raise ValueError(f"active_set (pairwise steps) needs one block per example: margin='zero_one' or a "
                             f"connected label graph; this one has {self.num_comp} components")
        self.active_sets: ActiveSets | None = None  # allocated at the first batch (K known then)
        self.evictions = 0
        with torch.no_grad():
            for p in self.params:
                p.zero_()
        self.active = torch.ones(M, dtype=torch.bool, device=ref.device)
        self.lin = torch.zeros(M, dtype=torch.float64, device=ref.device)  # (1/N) sum_i l_i
        self.found_mix: torch.Tensor | None = None  # ``start_at``'s line search, [M]
        self.nu_unary: torch.Tensor | None = None  # allocated at the first batch (K known then)
        self.nu_pair: torch.Tensor | None = None
        self.ell: torch.Tensor | None = None
        self.avg_unary: torch.Tensor | None = None  # averaging: the averaged dual state
        self.avg_pair: torch.Tensor | None = None
        self.avg_ell: torch.Tensor | None = None
        self.iterate = [torch.zeros_like(p) for p in self.params] if averaging else []
        self.iterate_lin = torch.zeros_like(self.lin)
        self.avg_steps = torch.zeros_like(self.lin)
        self.start_epoch()

    # ------------------------------------------------------------------ state
    def _ensure_state(self, K: int) -> None:
        if self.nu_unary is not None:
            return
        ref, g = self.params[0], self.energy.graph
        M = self.lam.shape[0]
        self.nu_unary = ref.new_zeros(self.num_examples, M, g.num_nodes, K)
        self.nu_pair = ref.new_zeros(self.num_examples, M, g.num_graphs * g.num_edges, K, K)
        self.ell = ref.new_zeros(self.num_examples, M, self.num_comp)
        self._load_active_sets({})
        if self.averaging:
            self.avg_unary, self.avg_pair = torch.zeros_like(self.nu_unary), torch.zeros_like(self.nu_pair)
            self.avg_ell = torch.zeros_like(self.ell)

    def _state_keys(self) -> list[str]:
        keys = ["nu_unary", "nu_pair", "ell", "active", "lin"]
        return keys + ["avg_unary", "avg_pair", "avg_ell", "iterate_lin", "avg_steps"] if self.averaging else keys

    def state_dict(self) -> dict[str, torch.Tensor | None]:
        """The dual state: nu_unary [N, M, n, K], nu_pair [N, M, E, K, K], ell [N, M, C], active [M], lin [M];
        with averaging also avg_unary, avg_pair, avg_ell (as nu, ell), iterate_lin [M], avg_steps [M] and
        iterate.<j> (the iterate's parameters, shaped as the energy's); escalated (bool [], ``step_oracle``); with
        an active set its labellings and weights (``active_labellings``, ``active_weights``)."""
        state = {k: getattr(self, k) for k in self._state_keys()} | {"escalated": torch.tensor(self.escalated)}
        if self.active_sets is not None:
            state |= {"active_labellings": self.active_sets.labellings, "active_weights": self.active_sets.weights}
        return state | {f"iterate.{j}": t for j, t in enumerate(self.iterate)}

    def load_state_dict(self, state: dict[str, torch.Tensor | None]) -> None:
        """Restore ``state_dict()`` (the energy's parameters are restored separately)."""
        missing = set(self._state_keys()) | {f"iterate.{j}" for j in range(len(self.iterate))}
        missing -= set(state)
        if missing:
            raise ValueError(f"state is missing keys {sorted(missing)}")
        if state["active"].shape != self.active.shape:
            raise ValueError(f"state['active'] must have shape {tuple(self.active.shape)}, "
                             f"got {tuple(state['active'].shape)}")
        for k in self._state_keys():
            v = state[k]
            if k in ("lin", "iterate_lin"):
                v = v.double()
            setattr(self, k, v.clone() if k in ("active", "lin", "iterate_lin", "avg_steps") else v)
        with torch.no_grad():
            for j, t in enumerate(self.iterate):
                t.copy_(state[f"iterate.{j}"])
        if bool(state.get("escalated", False)):  # (absent from checkpoints written before step oracles)
            self.step_oracle, self.escalated = self.oracle, True
        self._load_active_sets(state)

    def _load_active_sets(self, state: dict[str, torch.Tensor | None]) -> None:
        """The active sets of ``state`` where saved with the same shape, else every point all residual."""
        self.active_sets = None
        if self.nu_unary is None:
            return
        N, M, n, K = self.nu_unary.shape
        size = self.active_set
        if size == "auto":
            fit = min(self.AUTO_ACTIVE_SET, self.ACTIVE_SET_BYTES // (N * M * n),
                      self.ACTIVE_SET_PAIRS // max(self.nu_pair.shape[2], 1))
            size = fit if self.num_comp == 1 and fit >= 2 else 0
        if not size:
            return
        self.active_sets = ActiveSets(N, M, size, n, K, self.nu_unary.device)
        held = state.get("active_weights")
        if held is not None and held.shape == self.active_sets.weights.shape:
            self.active_sets.weights.copy_(held)
            self.active_sets.labellings.copy_(state["active_labellings"])

    def point_state(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The dual state of the point in the energy (certified by ``duality_gap``): the averages with
        averaging, else the iterate's: [N, M, n, K], [N, M, E, K, K], [N, M, C]."""
        if self.averaging:
            return self.avg_unary, self.avg_pair, self.avg_ell
        return self.nu_unary, self.nu_pair, self.ell

    def marginals(self, index: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The dual point mu_i = m(y_i) - nu_i (``point_state``) of examples ``index`` [B] with labels
        y [B, n]: unary [B, M, n, K], pairwise [B, M, E, K, K]."""
        nu_u, nu_p, _ = self.point_state()
        m_u, m_p = one_hot_marginals(y, self.energy.graph, nu_u.shape[-1], nu_u.dtype)
        return m_u.unsqueeze(1) - nu_u[index], m_p.unsqueeze(1) - nu_p[index]

    def _swap(self) -> None:
        """Exchange the energy's parameters and ``lin`` with the stored ``iterate`` and ``iterate_lin``
        (averaging: the energy holds the iterate during a step, the average between steps)."""
        with torch.no_grad():
            for p, q in zip(self.params, self.iterate):
                held = p.clone()
                p.copy_(q)
                q.copy_(held)
        self.lin, self.iterate_lin = self.iterate_lin, self.lin

    def _average(self) -> None:
        """After a step (energy: the new iterate; ``iterate``: the old average), fold the iterate into the
        average: avg <- k/(k+2) avg + 2/(k+2) iterate, for the active models (k = their steps so far)."""
        k = self.avg_steps
        c = torch.where(self.active, k / (k + 2), 1.0)  # [M]; 0 at the first step: avg = iterate
        with torch.no_grad():
            for p, a in zip(self.params, self.iterate):
                a.mul_(per_param(c, a, self.num_models)).add_(per_param(1 - c, p, self.num_models) * p)
            for avg, nu in ((self.avg_unary, self.nu_unary), (self.avg_pair, self.nu_pair), (self.avg_ell, self.ell)):
                view = c.view(1, -1, *([1] * (nu.dim() - 2)))
                avg.mul_(view).add_((1 - view) * nu)
        self.iterate_lin = c * self.iterate_lin + (1 - c) * self.lin
        self.avg_steps = k + self.active.to(k.dtype)

    def start_at(self, batches: Iterable[tuple[torch.Tensor, ...]], q: torch.Tensor) -> torch.Tensor:
        """Start (instead of w = 0) at the dual point of product distributions: example i's mu_i is
        (1 - c) m(y_i) + c mu(q_i), mu(q_i) the marginals of the distribution prod_l q_il over assignments (unary
        q_il, edges q_ia (x) q_ib: in every tree's marginal polytope), its expected loss Delta(y_i, .) in closed
        form, and c in [0, 1] the exact line search of D from the start (the weights w(mu) are c w(mu(q))).

        q [N, M, n, K]: a distribution over the K states per (example, model, label) (rows outside a model's
        mask are ignored); ``batches`` of (x, y, index) cover every example. Sets the dual state and the
        energy's parameters; returns c [M].

        A model whose c (``found_mix`` [M]) is below ``MIN_START_MIX`` starts at mu_i = m(y_i) (w = 0) instead.
        c grows with lambda (w(mu) scales as 1 / lambda) and falls as the point's loss saturates (0/1 margin, many
        labels flipped): with RTA on delicious (983 labels, lambda 2.2e-10) it was 0.0013, and BCFW from that start
        stood at 15.0 validation example F1 after its first epoch (18.0 after 1.4 passes in a one-epoch run), against
        20.2 from w = 0 after the same epoch (0.39-1.0 on every other dataset of the matrix, 0.77 at medical's
        shape)."""
        if q.dim() != 4 or q.shape[:2] != (self.num_examples, self.lam.shape[0]):
            raise ValueError(f"q must have shape [N={self.num_examples}, M={self.lam.shape[0]}, n, K], "
                             f"got {tuple(q.shape)}")
        f64 = torch.float64
        acc = [torch.zeros_like(p) for p in self.params]
        lin = torch.zeros_like(self.lam, dtype=f64)
        e = self.energy.graph.edges.reshape(-1, 2)
        for y, index, U, P, _ in self._lifted(batches):
            with torch.no_grad():
                keep = self.mask[:, index].T.to(U.dtype)  # [B, M]
                qi = q[index].to(U.dtype)
                m_u, m_p = one_hot_marginals(y, self.energy.graph, U.shape[-1], U.dtype)
                nu_u = (m_u.unsqueeze(1) - qi) * keep[..., None, None]
                mu_p = qi[..., e[:, 0], :, None] * qi[..., e[:, 1], None, :]
                nu_p = (m_p.unsqueeze(1) - mu_p) * keep[..., None, None, None]
                self.nu_unary[index], self.nu_pair[index] = nu_u, nu_p
                right = qi.gather(-1, y[:, None, :, None].expand(*qi.shape[:-1], 1)).squeeze(-1)  # [B, M, n]
                if self.margin == "hamming":
                    nodes = (1 - right).movedim(1, 0)
                    ell = self._per_component(nodes, nodes.new_zeros(()).expand(*nodes.shape[:-1], len(e)))
                    ell = ell.movedim(0, 1)
                else:
                    ell = (1 - right.prod(-1)).unsqueeze(-1)
                ell = self.margin_scale * ell * keep[..., None]
                self.ell[index] = ell
                lin += (ell.sum(-1).T.to(f64) / self.count[:, None]).sum(1)
            self._add_weights(acc, U, P, nu_u, nu_p)
        with torch.no_grad():
            sq = self._sq_norm([a * bs ** 0.5 for a, bs in zip(acc, self._bias_scale)], f64)
            c = torch.where(sq > 0, lin / (self.lam.to(f64) * sq).clamp_min(torch.finfo(f64).tiny), 1.0)
            self.found_mix = c.clamp(0.0, 1.0).to(self.lam.dtype)  # argmax_c c lin - lambda/2 c^2 |w|^2
            c = torch.where(self.found_mix >= self.MIN_START_MIX, self.found_mix, 0.0)  # else from w = 0
            for state in (self.nu_unary, self.nu_pair, self.ell):
                state.mul_(c.view(1, -1, *([1] * (state.dim() - 2))))
            if self.active_sets is not None:  # the start is no labelling: all residual
                self.active_sets.reset()
            for p, a, bs in zip(self.params, acc, self._bias_scale):
                p.copy_(per_param(c, p, self.num_models) * bs * a)
            self.lin = c.to(f64) * lin
            if self.averaging:
                self.avg_unary, self.avg_pair, self.avg_ell = (t.clone() for t in (self.nu_unary, self.nu_pair,
                                                                                  self.ell))
                for it, p in zip(self.iterate, self.params):
                    it.copy_(p)
                self.iterate_lin = self.lin.clone()
        return c

    def _lifted(self, batches: Iterable[tuple[torch.Tensor, ...]]
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Oracle | None]]:
        """For each batch (x, y, index) or (x, y, index, oracle): the checked labels y [B, n] and index [B], the
        lifted potentials U, P (``lift_models``) of x, with the dual state allocated, and the batch's oracle (None:
        none given)."""
        for batch in batches:
            x, y, index = batch[0], batch[1], batch[2]
            pot = self.energy(x)
            y, index = self._check_batch(pot, x, y, index)
            U, P = lift_models(pot, self.num_models)
            self._ensure_state(U.shape[-1])
            yield y, index, U, P, batch[3] if len(batch) > 3 else None

    def _add_weights(self, acc: list[torch.Tensor], U: torch.Tensor, P: torch.Tensor, nu_u: torch.Tensor,
                     nu_p: torch.Tensor, retain_graph: bool = False) -> None:
        """acc += the gradient of s <pot, nu> over the energy's parameters (w(mu) = R^-1 of the sum over every
        example), for lifted potentials U [M, B, n, K], P [M, B, E, K, K] and nu [B, M, n, K], [B, M, E, K, K]."""
        surrogate = self.scale * ((U * nu_u.movedim(1, 0)).sum((1, 2, 3)) + (P * nu_p.movedim(1, 0)).sum((1, 2, 3, 4)))
        grads = torch.autograd.grad(surrogate.sum(), self.params, allow_unused=True, retain_graph=retain_graph)
        with torch.no_grad():
            for a, g in zip(acc, grads):
                if g is not None:
                    a += g

    # ------------------------------------------------------------------ the step
    def start_epoch(self) -> None:
        """Reset the running (epoch) sums of block gaps and losses, and the count of rows they cover."""
        self.epoch_gap = torch.zeros_like(self.lam)
        self.epoch_loss = torch.zeros_like(self.lam)
        self.epoch_rows = 0

    def start_pass(self, batch_size: int, generator: torch.Generator | None = None,
                   device: torch.device | str = "cpu") -> tuple[torch.Tensor, ...]:
        """A new pass over the examples (``start_epoch``): their indices in an order drawn from ``generator``, in
        batches of ``batch_size`` ([<= batch_size] long each, on ``device``)."""
        self.start_epoch()
        return torch.randperm(self.num_examples, generator=generator).to(device).split(batch_size)

    def step(self, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor) -> StepInfo:
        """One block update on a batch: x [B, D], y [B, n] long, index [B] long (distinct example ids).
        With averaging, the step is the iterate's (``dual()`` after it is the average's)."""
        if not self.averaging:
            return self._step(x, y, index)
        self._swap()
        try:
            info = self._step(x, y, index)
            self._average()
        finally:
            self._swap()
        return info

    def _step(self, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor) -> StepInfo:
        pot = self.energy(x)
        y, index = self._check_batch(pot, x, y, index)
        U, P = lift_models(pot, self.num_models)
        self._ensure_state(U.shape[-1])
        with torch.no_grad():
            d_u, d_p, gaps, hinge, d_ell, vertex = self._terms(U.detach(), P.detach(), y, index, self.nu_unary,
                                                               self.nu_pair, self.ell, self.step_oracle)
            step_gaps, away = gaps, None  # the steps' gaps; ``gaps`` (Frank-Wolfe's) bound the dual's distance
            if self.active_sets is not None and bool((vertex[0].amax(-1) == 1).all()):
                d_u, d_p, step_gaps, d_ell, away = self._pairwise(U.detach(), P.detach(), y, index, d_u, d_p, d_ell,
                                                                  vertex)
            elif self.active_sets is not None:  # an oracle's maximisers that are not labellings
                self._no_labellings()
            gamma = self._block_steps(x, d_u, d_p, step_gaps, self.mask[:, index] & self.active[:, None])
            gd_u = gamma[..., self.node_comp, None] * d_u
            gd_p = gamma[..., self.edge_comp, None, None] * d_p
        surrogate = self.scale * ((U * gd_u).sum((1, 2, 3)) + (P * gd_p).sum((1, 2, 3, 4)))
        grads = torch.autograd.grad(surrogate.sum(), self.params, allow_unused=True)
        with torch.no_grad():
            grads = [torch.zeros_like(p) if g is None else g for p, g in zip(self.params, grads)]
            G = (gamma * step_gaps).sum((1, 2))
            curv = self.lam * self._sq_norm([g * bs ** 0.5 for g, bs in zip(grads, self._bias_scale)])
            tiny = torch.finfo(curv.dtype).tiny
            tmax = 1.0 / gamma.flatten(1).amax(1).clamp_min(tiny)  # keeps every t * gamma_b <= 1
            t = torch.where(curv > 0, torch.minimum(G / curv.clamp_min(tiny), tmax), tmax)
            t = torch.where((G > 0) & self.active, t, 0.0)
            for p, g, bs in zip(self.params, grads, self._bias_scale):
                p.sub_(per_param(t, p, self.num_models) * bs * g)
            self.nu_unary[index] -= (t[:, None, None, None] * gd_u).movedim(1, 0)
            self.nu_pair[index] -= (t[:, None, None, None, None] * gd_p).movedim(1, 0)
            self.ell[index] += (t[:, None, None] * gamma * d_ell).movedim(1, 0)
            self.lin += t * (gamma * d_ell).sum((1, 2)) / self.count
            if away is not None:
                eta = t[:, None].double() * gamma[..., 0].double() * away[1]
                self.evictions += self.active_sets.move(index, away[0], vertex[0].argmax(-1), eta)
            batch_gap = gaps.sum((1, 2))
            loss = (hinge * self.mask[:, index]).sum(1) / self.count
            self.epoch_gap += batch_gap
            self.epoch_loss += loss
            self.epoch_rows += len(index)
            return StepInfo(gap=batch_gap, loss=loss, step=t)

    def _block_steps(self, x: torch.Tensor, d_u: torch.Tensor, d_p: torch.Tensor, gaps: torch.Tensor,
                     allowed: torch.Tensor) -> torch.Tensor:
        """Steps gamma [M, B, C] of the batch's blocks (zero where not ``allowed`` [M, B]).

        steps="block": approximately maximise the exact dual increase over the box,
        gamma . g - lambda/2 |sum_b gamma_b u_b|^2, gamma in [0, 1]^(B x C), by ``sweeps`` Gauss-Seidel
        sweeps (the Gram of the u_b comes from the energy's ``block_gram``; components do not interact).
        steps="batch": all ones (the batch Frank-Wolfe direction).
        """
        allowed = allowed[..., None].expand_as(gaps).to(gaps.dtype)
        if self.steps == "batch":
            return allowed
        unlift = (lambda t: t[0]) if self.num_models is None else (lambda t: t)  # noqa: E731
        M, B, C = gaps.shape
        nodes, edges = self.energy.block_gram(x, unlift(d_u), unlift(d_p), 1.0 / self.bias_reg, summed=C == 1)
        if self.num_models is None:
            nodes, edges = nodes.unsqueeze(0), edges.unsqueeze(0)
        if C == 1:  # one block per example (the 0/1 margin, a connected graph): the sums, without per-edge parts
            A = (nodes + edges).unsqueeze(1)
        else:
            A = nodes.new_zeros(M, C, B, B).index_add_(1, self.node_comp, nodes).index_add_(1, self.edge_comp, edges)
        A = A * (self.lam * self.scale ** 2)[:, None, None, None]
        return _gauss_seidel(A, gaps.transpose(1, 2), allowed.transpose(1, 2), self.sweeps).transpose(1, 2)

    def _terms(self, U: torch.Tensor, P: torch.Tensor, y: torch.Tensor, index: torch.Tensor,
               nu_unary: torch.Tensor, nu_pair: torch.Tensor, ell: torch.Tensor, oracle: Oracle | None = None):
        """FW directions d = mu_hat - mu ([M, B, n, K], [M, B, E, K, K]) from the dual state nu_unary
        [N, M, n, K], nu_pair [N, M, E, K, K], ell [N, M, C], block gaps [M, B, C] (masked, divided by N_m),
        hinge losses [M, B] (upper bounds: from the oracle's value), the loss direction Delta(y_i, y_hat) - l_i
        per block [M, B, C], and the vertex (mu_hat unary, pairwise, its loss per block [M, B, C]); mu_hat from
        ``oracle`` (default: the certificate's ``self.oracle``)."""
        oracle = self.oracle if oracle is None else oracle
        K = U.shape[-1]
        m_u, m_p = one_hot_marginals(y, self.energy.graph, K, U.dtype)
        score = (U * m_u).sum((-1, -2)) + (P * m_p).sum((-1, -2, -3))  # [M, B]
        if self.margin == "hamming":
            delta = hamming_margin(y, K, self.margin_scale, U.dtype)
            value, mh_u, mh_p = oracle(self._potentials(U + delta, P))
            value = torch.maximum(value, score)  # y_i itself is an assignment (Delta = 0): the max is >= its score
            loss = self._per_component((delta * mh_u).sum(-1), P.new_zeros(()).expand(*score.shape, P.shape[-3]))
        else:  # max(score(y_i), margin + max_{y != y_i} score(y)): the worst violator, or y_i itself
            value, mh_u, mh_p = oracle(self._potentials(U, P), exclude=y)
            value = value + self.margin_scale
            truth = score >= value
            value = torch.where(truth, score, value)
            mh_u = torch.where(truth[..., None, None], m_u, mh_u)
            mh_p = torch.where(truth[..., None, None, None], m_p, mh_p)
            loss = torch.where(truth, 0.0, self.margin_scale).to(U.dtype)[..., None]
        d_u = mh_u - m_u + nu_unary[index].movedim(1, 0)
        d_p = mh_p - m_p + nu_pair[index].movedim(1, 0)
        d_ell = loss - ell[index].movedim(1, 0)
        gaps = self._per_component((U * d_u).sum(-1), (P * d_p).sum((-1, -2))) + d_ell
        gaps = gaps * (self.mask[:, index] / self.count[:, None])[..., None]
        return d_u, d_p, gaps, value - score, d_ell, (mh_u, mh_p, loss)

    def _no_labellings(self) -> None:
        """The oracle's maximisers are no labellings: active_set="auto" turns to Frank-Wolfe steps, else an error."""
        if self.active_set != "auto":
            raise ValueError("active_set (pairwise steps) needs an oracle whose maximisers are labellings (one-hot "
                             "marginals): tree_oracle or EnsembleOracle, not smoothed_oracle")
        self.active_set, self.active_sets = 0, None

    def _pairwise(self, U: torch.Tensor, P: torch.Tensor, y: torch.Tensor, index: torch.Tensor, d_u: torch.Tensor,
                  d_p: torch.Tensor, d_ell: torch.Tensor, vertex: tuple[torch.Tensor, ...]):
        """Pairwise directions of the batch's blocks (one per example), from the Frank-Wolfe directions d = mu_hat - mu
        (unary [M, B, n, K], pairwise [M, B, E, K, K], loss [M, B, 1]) and the vertex (mu_hat unary, pairwise, loss):
        from the away atom v (the held labelling of least loss-augmented score, or the residual) to mu_hat, times v's
        weight w_v so that steps gamma in [0, 1] keep every weight >= 0. Returns d = w_v (mu_hat - m(v)) (as d),
        its gap [M, B, 1] (divided by N_m), its loss direction [M, B, 1], and (v [M, B], S for the residual, w_v
        [M, B] float64)."""
        (mh_u, mh_p, loss), K, dtype = vertex, U.shape[-1], U.dtype
        edges = self.energy.graph.edges.reshape(-1, 2).to(U.device)
        Y, A = self.active_sets.gather(index)  # [M, B, S, n], [M, B, S]
        S = Y.shape[2]
        mu_u, mu_p, ell = mh_u - d_u, mh_p - d_p, (loss - d_ell).sum(-1)  # the current point and its loss
        wrong = Y != y[None, :, None, :]
        delta = self.margin_scale * (wrong.sum(-1) if self.margin == "hamming" else wrong.any(-1)).to(dtype)
        pairs = pair_index(Y, edges, K)
        aug = labelling_scores(U, P, Y, pairs) + delta  # [M, B, S]
        r = (1.0 - A.sum(-1)).clamp_min(0.0)  # the residual's weight
        held_loss = (A.to(dtype) * delta).sum(-1)
        r_aug = (U * mu_u).sum((-1, -2)) + (P * mu_p).sum((-1, -2, -3)) + ell - (A.to(dtype) * aug).sum(-1)
        r_aug = torch.where(r > ActiveSets.MIN_RESIDUAL, r_aug / r.clamp_min(ActiveSets.MIN_RESIDUAL).to(dtype),
                            torch.inf)  # the residual's own loss-augmented score
        away = torch.cat([torch.where(A > 0, aug, torch.inf), r_aug[..., None]], -1).argmin(-1)
        residual, v = away == S, away.clamp_max(S - 1)
        w = torch.cat([A, r[..., None]], -1).gather(-1, away[..., None]).squeeze(-1)
        # the mass that leaves: w_v m(y_v), or the residual's mu - sum_j A_j m(y_j) (one scatter for both)
        leaving = torch.where(residual[..., None], A, torch.zeros_like(A).scatter(-1, v[..., None], w[..., None]))
        out_u, out_p = weighted_marginals(Y, pairs, leaving, K, dtype)
        res, wd = residual[..., None, None], w.to(dtype)
        d_u = wd[..., None, None] * mh_u - torch.where(res, mu_u - out_u, out_u)
        d_p = wd[..., None, None, None] * mh_p - torch.where(res[..., None], mu_p - out_p, out_p)
        l_v = torch.where(residual, ell - held_loss, wd * delta.gather(-1, v[..., None]).squeeze(-1))
        d_ell = (wd * loss.sum(-1) - l_v)[..., None]
        gaps = self._per_component((U * d_u).sum(-1), (P * d_p).sum((-1, -2))) + d_ell
        return d_u, d_p, gaps * (self.mask[:, index] / self.count[:, None])[..., None], d_ell, (away, w)

    def _potentials(self, U: torch.Tensor, P: torch.Tensor) -> Potentials:
        """The oracle's Potentials from ``lift_models``' unary [M, B, n, K] and pairwise [M, B, E, K, K]
        (ensembles: back to [M, B, T, n-1, K, K], the mean score's scale)."""
        g = self.energy.graph
        if g.is_ensemble:
            P = (P * g.num_graphs).unflatten(-3, (g.num_graphs, g.num_edges))
        return Potentials(U, P, g)

    # ------------------------------------------------------------------ certificates
    def dual(self) -> torch.Tensor:
        """D(mu) [M] at the current parameters (= w(mu) up to rounding), float64."""
        return self.lin - 0.5 * self.lam.double() * self.sq_norm()

    def sq_norm(self) -> torch.Tensor:
        """|w|_R^2 [M] of the current parameters (biases weighted by bias_reg), summed in float64."""
        with torch.no_grad():
            return self._sq_norm([p / bs ** 0.5 for p, bs in zip(self.params, self._bias_scale)], torch.float64)

    def gap_estimate(self) -> torch.Tensor:
        """Relative duality gap estimated from this epoch's block gaps [M] (exact only at a fixed w)."""
        primal = self.dual() + self.epoch_gap
        return self.epoch_gap / primal.clamp_min(torch.finfo(primal.dtype).tiny)

    def should_certify(self) -> bool:
        """True when some active model's running estimate is below tol: time for ``duality_gap``. With
        averaging always (while a model is active): the running estimate is the iterate's, and the
        average's gap, often much smaller, has no cheap estimate. Never before a pass over every row since
        ``start_epoch``: the estimate sums the block gaps of the rows stepped (0 for an epoch without a step)."""
        if self.epoch_rows < self.num_examples:
            return False
        if self.averaging:
            return bool(self.active.any())
        return bool((self.active & (self.gap_estimate() <= self.tol)).any())

    def block_gaps(self, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Per-example Frank-Wolfe gaps [M, B] at the current w, without updating anything."""
        with torch.no_grad():
            pot = self.energy(x)
            y, index = self._check_batch(pot, x, y, index)
            U, P = lift_models(pot, self.num_models)
            self._ensure_state(U.shape[-1])
            return self._terms(U, P, y, index, *self.point_state())[2].sum(-1)

    def duality_gap(self, batches: Iterable[tuple[torch.Tensor, ...]]) -> GapInfo:
        """Exact P(w) - D(mu) by one pass over ``batches`` of (x, y, index) covering every example; a batch
        (x, y, index, oracle) searches with that oracle instead of ``oracle`` (None: ``oracle``), e.g. the steps'
        cheaper one where the pass would not fit the time budget: its value must bound the max from above (Lemma 7's
        bound does), so the primal stays an upper bound and the gap a certificate, a looser one.

        D(mu) uses w(mu) rebuilt from the dual state (no drift), so the certificate holds for the
        current parameters. With averaging, w is the average and D the larger of D(mu_avg) and
        D(mu_iterate) (both lower-bound the optimum). Models whose relative gap is <= tol become
        inactive (stop moving). With a step oracle of its own, the pass also searches with it, for ``_escalate``.
        """
        num_states = 2 if self.averaging else 1  # the point's dual state, then the iterate's
        f64 = torch.float64  # sums over examples and coordinates in float64: rounding must not fake a certificate
        hinge = torch.zeros_like(self.lam, dtype=f64)
        checks_steps = self.step_oracle is not self.oracle  # then also its candidates' FW gaps, for ``_escalate``
        found, step_found = torch.zeros_like(hinge), torch.zeros_like(hinge)  # the candidates' summed FW gaps
        lins = [torch.zeros_like(self.lam, dtype=f64) for _ in range(num_states)]
        accs = [[torch.zeros_like(p) for p in self.params] for _ in range(num_states)]
        seen = torch.zeros(self.num_examples, dtype=torch.bool, device=self.lam.device)
        for y, index, U, P, oracle in self._lifted(batches):
            states = [self.point_state(), (self.nu_unary, self.nu_pair, self.ell)][:num_states]
            w = (self.mask[:, index] / self.count[:, None]).to(f64)
            oracle = self.oracle if oracle is None else oracle
            with torch.no_grad():
                terms = self._terms(U.detach(), P.detach(), y, index, *states[0], oracle)
                hinge += (terms[3].to(f64) * w).sum(1)
                found += terms[2].sum((1, 2)).to(f64)
                if checks_steps and oracle is self.step_oracle:  # this batch's search was the steps' own
                    step_found += terms[2].sum((1, 2)).to(f64)
                elif checks_steps:  # not one of the steps' searches: their counts stay as they were
                    with getattr(self.step_oracle, "uncounted", nullcontext)():
                        step = self._terms(U.detach(), P.detach(), y, index, *states[0], self.step_oracle)
                    step_found += step[2].sum((1, 2)).to(f64)
                seen[index] = True
            for j, (state_u, state_p, state_ell) in enumerate(states):
                self._add_weights(accs[j], U, P, state_u[index], state_p[index], retain_graph=j + 1 < num_states)
                with torch.no_grad():
                    lins[j] += (state_ell[index].sum(-1).T.to(f64) * w).sum(1)
        if not bool(seen.all()):
            raise ValueError(f"duality_gap needs batches covering all {self.num_examples} examples, "
                             f"got {int(seen.sum())}")
        with torch.no_grad():
            lam = self.lam.to(f64)
            duals = [lin - 0.5 * lam * self._sq_norm([a * bs ** 0.5 for a, bs in zip(acc, self._bias_scale)], f64)
                     for lin, acc in zip(lins, accs)]
            info = certificate(0.5 * lam * self.sq_norm() + hinge, torch.stack(duals).amax(0), self.tol,
                               "bcfw", self.lam.dtype)
            self.lin = lins[0]
            self.active &= ~info.converged.to(self.active.device)
            if checks_steps:
                self._escalate(found, step_found, info.primal)
        return info

    def _escalate(self, found: torch.Tensor, step_found: torch.Tensor, primal: torch.Tensor) -> None:
        """The steps take the certificate's oracle once its candidates' gap (``found`` [M], summed FW gaps) is above
        tol for an active model whose step oracle's candidates (``step_found``) are within it."""
        scale = self.tol * primal.abs()
        if bool((self.active.to(primal.device) & (found > scale) & (step_found <= scale)).any()):
            self.step_oracle, self.escalated = self.oracle, True

    def fit(self, x: torch.Tensor, y: torch.Tensor, max_epochs: int = 1000, batch_size: int = 64,
            generator: torch.Generator | None = None) -> GapInfo:
        """Train on tensors x [N, D], y [N, n] (example i = row i) until every model is certified
        (relative gap <= tol) or ``max_epochs``; returns the last exact ``GapInfo``."""
        if x.shape[0] != self.num_examples or y.shape[0] != self.num_examples:
            raise ValueError(f"x and y must have num_examples={self.num_examples} rows, "
                             f"got {x.shape[0]} and {y.shape[0]}")
        every = torch.arange(self.num_examples, device=x.device)
        full = [(x[i], y[i], i) for i in every.split(max(batch_size, 256))]
        info = None
        for _ in range(max_epochs):
            for i in self.start_pass(batch_size, generator, x.device):
                self.step(x[i], y[i], i)
            if self.should_certify():
                info = self.duality_gap(full)
                if not bool(self.active.any()):
                    return info
        return self.duality_gap(full) if info is None or bool(self.active.any()) else info

    # ------------------------------------------------------------------ helpers
    def _check_batch(self, pot: Potentials, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        B = x.shape[0]
        lead = 2 if self.num_models is not None else 1
        if pot.unary.dim() != lead + 2 or pot.unary.shape[lead - 1] != B:
            raise ValueError(f"energy potentials must have unary [{'M, ' if lead == 2 else ''}B={B}, n, K], "
                             f"got {tuple(pot.unary.shape)}")
        if not isinstance(index, torch.Tensor) or index.dtype != torch.long or index.shape != (B,):
            raise ValueError(f"index must be a LongTensor of shape [B={B}], got "
                             f"{getattr(index, 'dtype', type(index))} {tuple(getattr(index, 'shape', ()))}")
        if B and (index.min() < 0 or index.max() >= self.num_examples):
            raise ValueError(f"index values must lie in [0, num_examples={self.num_examples})")
        if y.shape[:1] != (B,):
            raise ValueError(f"y must have shape [B={B}, n], got {tuple(y.shape)}")
        return pot.check_labels(y), index.to(self.lam.device)

    def _per_component(self, nodes: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
        """Sum per-node [M, B, n] and per-edge [M, B, E] terms into components [M, B, C]."""
        out = nodes.new_zeros(*nodes.shape[:-1], self.num_comp)
        out.index_add_(-1, self.node_comp, nodes)
        return out.index_add_(-1, self.edge_comp, edges)

    def _sq_norm(self, tensors: list[torch.Tensor], dtype: torch.dtype | None = None) -> torch.Tensor:
        """sum over each model's coordinates of t^2 [M], for tensors with (or without) a leading [M] dim, summed
        in ``dtype`` (default: lambda's)."""
        out = torch.zeros_like(self.lam, dtype=dtype)
        for t in tensors:
            t = t.to(out.dtype)
            if self.num_models is None:
                out += t.pow(2).sum()
            else:
                out += t.pow(2).flatten(1).sum(1) if t.dim() > 1 else t.pow(2)
        return out


def lift_models(pot: Potentials, num_models: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """unary [M, B, n, K], pairwise [M, B or 1, E, K, K] with an explicit model dim (M = 1 when num_models
    is None) from the potentials of an energy with ``num_models``. Ensembles of T trees score the mean over
    trees: pairwise [.., T, n-1, K, K] becomes one list of E = T (n-1) edges scaled by 1/T (a per-tree
    unary is averaged), so score(y) = <U, m_u(y)> + <P, m_p(y)> as for a single graph."""
    U, P = pot.unary, pot.pairwise
    if pot.graph.is_ensemble:
        if pot.unary_per_graph:
            U = U.mean(-3)
        P = P.flatten(-4, -3) / pot.graph.num_graphs
    if num_models is None:
        U = U.unsqueeze(0)
    while P.dim() < 5:
        P = P.unsqueeze(0)
    return U, P


def _gauss_seidel(A: torch.Tensor, g: torch.Tensor, ok: torch.Tensor, sweeps: int) -> torch.Tensor:
    """Maximise gamma . g - 1/2 gamma^T A gamma over gamma in [0, 1]^B (zero where not ``ok``) by cyclic
    exact coordinate steps. A [M, C, B, B] PSD, g and ok [M, C, B] -> gamma [M, C, B]. On backend "fused" one
    kernel call (``csrc/dcd_cpu.cpp``: ``box_gauss_seidel``), else a loop of batched torch ops."""
    if fused_active(g):
        M, C, B = g.shape
        return fused.kernels().box_gauss_seidel(A.reshape(M * C, B, B).contiguous(), g.reshape(M * C, B).contiguous(),
                                                ok.to(g.dtype).reshape(M * C, B).contiguous(), sweeps).view(M, C, B)
    diag = A.diagonal(dim1=-2, dim2=-1)
    inv = torch.where(diag > 0, 1.0 / diag.clamp_min(1e-300), torch.zeros_like(diag))
    gamma = torch.where(diag > 0, torch.zeros_like(g), (g > 0).to(g.dtype)) * ok  # free directions: full step
    g_t, inv_t, ok_t = g.permute(2, 0, 1).contiguous(), inv.permute(2, 0, 1).contiguous(), ok.permute(2, 0, 1)
    cols = A.permute(3, 0, 1, 2).contiguous()  # [B, M, C, B]
    gam = gamma.permute(2, 0, 1).contiguous()  # [B, M, C]
    r = torch.zeros_like(g)  # A gamma (the free directions have zero columns)
    for _ in range(sweeps):
        for i in range(g_t.shape[0]):
            old = gam[i].clone()
            new = (old + (g_t[i] - r[..., i]) * inv_t[i]).clamp(0.0, 1.0) * ok_t[i]
            r += cols[i] * (new - old).unsqueeze(-1)
            gam[i] = new
    return gam.permute(1, 2, 0)


def check_lam(lam: float | torch.Tensor, M: int, ref: torch.Tensor) -> torch.Tensor:
    t = torch.as_tensor(lam, dtype=ref.dtype, device=ref.device)
    if t.dim() == 0:
        t = t.expand(M).clone()
    if t.shape != (M,):
        raise ValueError(f"lam must be a float or a tensor of shape [M={M}], got shape {tuple(t.shape)}")
    if not bool((t > 0).all()) or not bool(torch.isfinite(t).all()):
        raise ValueError(f"lam must be finite and > 0, got {t.tolist()}")
    return t


def check_mask(mask: torch.Tensor | None, M: int, N: int, device: torch.device) -> torch.Tensor:
    if mask is None:
        return torch.ones(M, N, dtype=torch.bool, device=device)
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError("mask must be a bool tensor of shape [M, N]")
    if mask.dim() == 1 and mask.shape[0] == N:
        mask = mask.unsqueeze(0).expand(M, N)
    if mask.shape != (M, N):
        raise ValueError(f"mask must have shape [M={M}, N={N}], got {tuple(mask.shape)}")
    if not bool(mask.any(1).all()):
        raise ValueError("every model needs at least one training example in mask")
    return mask.to(device)


def per_param(t: torch.Tensor, p: torch.Tensor, num_models: int | None) -> torch.Tensor:
    """Per-model values t [M] shaped to broadcast against a parameter-shaped tensor p (a scalar without models)."""
    return t.reshape(()) if num_models is None else t.view(-1, *([1] * (p.dim() - 1)))
