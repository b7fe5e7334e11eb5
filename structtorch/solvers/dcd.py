"""Dual coordinate descent for Independent's objective (one L1-loss linear SVM per label): liblinear's solver
(Hsieh, Chang, Lin, Keerthi, Sathiyamoorthi, ICML 2008), certified by the duality gap.

Independent's Hamming hinge decomposes over the labels. With the biases regularised like weights scaled by rho,

    P(W, b) = lambda/2 (|W|^2 + rho |b|^2) + (1/N) sum_i sum_l max(0, 1 - s_il (w_l . x_i + b_l)),   s = 2y - 1,

is, label by label, lambda times liblinear's 1/2 |w~|^2 + C sum_i max(0, 1 - s_i w~ . x~_i) with C = 1 / (lambda N),
x~ = [x, 1 / sqrt(rho)] and w~ = [w, sqrt(rho) b]. Its dual

    D(alpha) = lambda sum_l (sum_i alpha_il - 1/2 |w~_l(alpha)|^2),   w~_l(alpha) = sum_i alpha_il s_il x~_i,
    0 <= alpha <= C,

is a lower bound on the optimum for every feasible alpha, so P(W(alpha)) - D(alpha) certifies W(alpha). A large bias
input (small rho) makes the coordinate steps move little but the bias: at delicious' shape and rho = 1e-4 the gap was
still 0.017 after 445 epochs (400 s). The dual box does not depend on rho, so a fit at rho < 1 goes by continuation:
stages rho' = 1, 0.1, ..., rho, each from the last one's alpha to tol (delicious: certified in 408 s). The certificate
is always rho's: P_rho of the stage's weights (b = sum_i alpha_i s_i / rho') against D_rho(alpha). Each
epoch visits the rows in a fresh random order and gives every label its exact coordinate step (``svm_dcd``, a fused
CPU kernel: the labels in SIMD blocks, split over torch's threads). Everything is float64 on the CPU, whatever the
energy's device; the weights are written into the energy after every certificate.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass

import torch

from ..energies import FinleyJoachimsEnergy
from ..graph import Graph
from ..inputs import BLOCK_ELEMENTS, csr, csr_transpose, sparse_rows
from ..progress import out_of_time, tick
from .bcfw import check_lam, check_mask
from .certificate import GapInfo, certificate

__all__ = ["MAX_EPOCHS", "SPARSE_DENSITY", "DualCD", "SparseRows", "available", "independent_duals", "independent_svms"]

log = logging.getLogger(__name__)

#: DCD epochs at most in a fit unless its caller says otherwise
MAX_EPOCHS = 1000
#: the share of nonzeros in the rows less their columns' most frequent values (``SparseRows``) up to which DCD steps
#: through the nonzeros only. An epoch on one thread, dense / sparse kernel: tmc2007 (4.3%) 8.7x faster sparse, flags
#: (19%) 1.2x, birds (56%) 1.2x, scene (98%) 0.7x; 0.25 keeps the sparse kernel to where it clearly wins
SPARSE_DENSITY = 0.25


class DualCD:
    """Certified dual coordinate descent on M models of one linear SVM per label.

    Args:
        energy: a ``FinleyJoachimsEnergy`` without edges (Independent), ``num_models=M`` or None.
        x [N, D], y [N, n] (0/1): the training set.
        lam: lambda > 0, a float or a tensor [M].
        bias_reg: rho > 0, the biases' regulariser relative to lambda (the bias input is 1 / sqrt(rho') at the
            continuation's current stage rho', ``stage``).
        tol: relative duality gap at which a model is certified.
        mask: bool [M, N] (or [N]), the rows each model trains on (CV folds); default all.
        seed: seed of the epochs' row orders (epoch e's order depends on seed and e only).
        continuation: at rho < 1, fit by the stages rho' = 1, 0.1, ..., rho (else at rho from the start).

    State: alpha [M, n, N] (float64, CPU), the dual variables, from 0 (w = 0); the continuation's stage rho'.
    """

    def __init__(self, energy: FinleyJoachimsEnergy, x: torch.Tensor, y: torch.Tensor, lam: float | torch.Tensor,
                 bias_reg: float = 1.0, tol: float = 1e-3, mask: torch.Tensor | None = None, seed: int = 0,
                 continuation: bool = True) -> None:
        if not self.supports(energy):
            raise ValueError("DualCD solves one linear SVM per label: it needs a FinleyJoachimsEnergy without "
                             f"edges (Independent), got {type(energy).__name__} on {energy.graph}")
        if x.dim() != 2 or y.shape != (x.shape[0], energy.graph.num_nodes):
            raise ValueError(f"x [N, D] and y [N, n={energy.graph.num_nodes}] must have the same rows, got "
                             f"{tuple(x.shape)} and {tuple(y.shape)}")
        if not bias_reg > 0:
            raise ValueError(f"bias_reg must be > 0, got {bias_reg}")
        self.kernels = _kernels()
        cpu = torch.device("cpu")
        self.energy, self.tol = energy, float(tol)
        self.num_models = energy.num_models
        M = 1 if self.num_models is None else self.num_models
        self.lam = check_lam(lam, M, torch.zeros((), dtype=torch.float64))
        self.mask = check_mask(mask, M, x.shape[0], cpu)
        self.count = self.mask.sum(1).to(torch.float64)
        self.bias_reg = float(bias_reg)
        self.has_bias = energy.unary.bias is not None
        #: rho' of the continuation's current stage (1 on the way to rho < 1, else rho)
        self.stage = 1.0 if continuation and self.has_bias and self.bias_reg < 1.0 else self.bias_reg
        N, D = x.shape
        x64 = torch.empty(N, D + self.has_bias, dtype=torch.float64)  # one copy, the bias input written in place
        x64[:, :D] = x.detach()
        if self.has_bias:
            x64[:, D] = 1.0 / math.sqrt(self.stage)
        self.rows = SparseRows.of(x64)  # None: dense rows
        #: the rows [N, D (+ 1)] for the dense kernel; None where the sparse one steps through ``rows`` alone (at
        #: bookmarks' shape, 55,349 x 2,151, it held 952 MB for the whole fit)
        self.x = x64 if self.rows is None else None
        self.sign = (2.0 * y.to(cpu, torch.float64) - 1.0).contiguous()  # [N, n]
        n = self.sign.shape[1]
        self.alpha = torch.zeros(M, n, N, dtype=torch.float64)
        self.w = torch.zeros(M, n, x64.shape[1], dtype=torch.float64)  # w~(alpha) [M, n, D + 1]
        self.seed = seed
        self.epochs = 0
        self.last: GapInfo | None = None  # the certificate of the current alpha (None once epochs ran after it)
        self.stage_gap: GapInfo | None = None  # the same weights' gap on the current stage's objective
        self.bias: torch.Tensor | None = None  # [M, n], of the last certificate's weights

    @staticmethod
    def supports(energy: object) -> bool:
        """Whether ``energy`` is one linear SVM per label (a FinleyJoachimsEnergy without edges)."""
        return isinstance(energy, FinleyJoachimsEnergy) and energy.graph.num_edges == 0

    def run(self, epochs: int, models: torch.Tensor | None = None) -> None:
        """``epochs`` epochs of coordinate steps for the models where ``models`` [M] (bool; default all)."""
        for m in range(len(self.lam)):
            if models is not None and not bool(models[m]):
                continue
            rows = self.mask[m].nonzero()[:, 0]
            order = torch.stack([rows[self._permutation(len(rows), self.epochs + e)] for e in range(epochs)])
            C = 1.0 / float(self.lam[m] * self.count[m])
            if self.rows is None:
                self.kernels.svm_dcd(self.x, self.sign, order.contiguous(), self.alpha[m], self.w[m], C)
            else:
                rows = self.rows
                self.kernels.svm_dcd_sparse(rows.indptr, rows.indices, rows.values, rows.c, rows.q, self.sign,
                                            order.contiguous(), self.alpha[m], self.w[m], C)
        self.epochs += epochs
        self.last = None

    def _permutation(self, size: int, epoch: int) -> torch.Tensor:
        """Epoch ``epoch``'s row order: a function of (seed, epoch) alone, so a resumed run repeats the same steps."""
        return torch.randperm(size, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + epoch))

    def certify(self) -> GapInfo:
        """The duality gap [M] of the weights w~(alpha) on rho's objective, recomputed from alpha (no drift of the
        kernel's running sums); writes them into the energy. Sets ``self.last`` and ``self.stage_gap``."""
        coef = self.alpha * self.sign.T  # [M, n, N]
        D = self.w.shape[-1] - self.has_bias
        if self.rows is None:
            self.w = torch.einsum("mln,nd->mld", coef, self.x).contiguous()  # the kernel's layout, at the stage's input
            margins = torch.einsum("nd,mld->mnl", self.x[:, :D], self.w[..., :D])  # [M, N, n] without the bias
        else:
            self.w, margins = self.rows.weights_and_margins(coef, D)
        feature_sq = self.w[..., :D].pow(2).sum((1, 2))
        alpha_sum = self.alpha.sum((1, 2))
        if not self.has_bias:
            self.last = self.stage_gap = self._certificate(margins, feature_sq, feature_sq, alpha_sum)
        else:
            S = coef.sum(2)  # [M, n]: the bias is S / rho' at the stage's optimum
            self.bias = S / self.stage
            margins = margins + self.bias[:, None, :]
            at = {rho: self._certificate(margins, feature_sq + rho * self.bias.pow(2).sum(1),
                                         feature_sq + S.pow(2).sum(1) / rho, alpha_sum)
                  for rho in {self.bias_reg, self.stage}}  # one certificate once the last stage is reached
            self.last, self.stage_gap = at[self.bias_reg], at[self.stage]
        self._write_back()
        return self.last

    def _certificate(self, margins: torch.Tensor, primal_sq: torch.Tensor, dual_sq: torch.Tensor,
                     alpha_sum: torch.Tensor) -> GapInfo:
        """P(W, b) - D(alpha) [M]: margins [M, N, n] of the weights, their |w|^2 + rho |b|^2 and |w~(alpha)|^2 [M] at
        one rho, sum_i alpha_i [M]."""
        hinge = ((1.0 - margins * self.sign).clamp_min(0.0).sum(2) * self.mask).sum(1)
        primal = self.lam * 0.5 * primal_sq + hinge / self.count
        dual = self.lam * (alpha_sum - 0.5 * dual_sq)
        return certificate(primal, dual, self.tol, "dcd", torch.float64)

    def fit(self, max_epochs: int = MAX_EPOCHS, check_every: int = 5) -> GapInfo:
        """Epochs until every model is certified (relative gap <= tol), ``max_epochs`` in all, or the run's time
        budget is spent (``progress.time_budget``); certified every ``check_every`` epochs. The continuation moves on
        to the next stage once every model not yet certified is certified on the stage's objective."""
        info = self.last if self.last is not None else self.certify()  # the last fit's closing one, if still current
        while not bool(info.converged.all()) and self.epochs < max_epochs and not out_of_time():
            if self.stage > self.bias_reg and bool(self.stage_gap.converged[~info.converged].all()):
                self._set_stage(max(self.stage / 10.0, self.bias_reg))
                info = self.certify()
                continue
            self.run(min(check_every, max_epochs - self.epochs), ~info.converged.cpu())
            info = self.certify()
            if not tick(self.epochs, max_epochs, "DCD epochs", self._gap_note):
                break
        return info

    def _set_stage(self, rho: float) -> None:
        """The continuation's stage rho' (the bias input 1 / sqrt(rho'))."""
        self.stage, bias_input = rho, 1.0 / math.sqrt(rho)
        if self.rows is None:
            self.x[:, -1] = bias_input
        else:  # the bias column is constant: z's stays 0, its c and every |x_i|^2 move with it
            self.rows.q += bias_input**2 - float(self.rows.c[-1]) ** 2
            self.rows.c[-1] = bias_input
        self.last = None

    def _gap_note(self) -> str:
        if self.last is None:
            return ""
        stage = "" if self.stage == self.bias_reg else \
            f"; {float(self.stage_gap.relative_gap.max()):.2g} at the continuation's bias_reg {self.stage:g}"
        return f"last relative duality gap {float(self.last.relative_gap.max()):.2g}, tol {self.tol:g}{stage}"

    def _write_back(self) -> None:
        """The weights into the energy's weight [(M,) n, D] and bias [(M,) n]."""
        unary, D = self.energy.unary, self.energy.unary.weight.shape[-1]
        weight, bias = (self.w[..., :D], self.bias if self.has_bias else None)
        if self.num_models is None:
            weight, bias = weight[0], None if bias is None else bias[0]
        with torch.no_grad():
            unary.weight.copy_(weight)
            if bias is not None:
                unary.bias.copy_(bias)

    def state_dict(self) -> dict[str, torch.Tensor | int | float]:
        """alpha [M, n, N], the epochs done and the continuation's stage."""
        return {"alpha": self.alpha.clone(), "epochs": self.epochs, "stage": self.stage}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()``, then the weights (into the energy) and their certificate."""
        if tuple(state["alpha"].shape) != tuple(self.alpha.shape):
            raise ValueError(f"DualCD state: alpha {tuple(state['alpha'].shape)} does not match this problem's "
                             f"{tuple(self.alpha.shape)}")
        self.alpha = state["alpha"].to(torch.float64).contiguous().clone()
        self.epochs = int(state["epochs"])
        if self.has_bias:
            self._set_stage(float(state.get("stage", self.bias_reg)))
        self.certify()


@dataclass
class SparseRows:
    """Rows x_i = z_i + c [N, D] with z sparse: c [D] each column's most frequent value (0 for sparse features; a
    standardised sparse column's is the value its zeros became; the bias input's is the input), z [N, D] in CSR
    (indptr [N + 1], indices [nnz] int64, values [nnz]; ``z``, ``zt``: z and z^T as sparse CSR tensors) and
    q [N] = |x_i|^2, all on the CPU. ``svm_dcd_sparse`` takes svm_dcd's steps in O(nnz(z_i)) per row and label, and
    the certificate's products go through z's nonzeros: delicious' rows are 3.7% such nonzeros."""

    indptr: torch.Tensor
    indices: torch.Tensor
    values: torch.Tensor
    c: torch.Tensor
    q: torch.Tensor
    z: torch.Tensor
    zt: torch.Tensor

    @staticmethod
    def of(x: torch.Tensor) -> SparseRows | None:
        """x [N, D] float64 as ``SparseRows`` (``sparse_rows``: block by block, no [N, D] temporary beside x), or
        None where more than ``SPARSE_DENSITY`` of z's entries are nonzero (the dense kernel is then faster)."""
        parts = sparse_rows(x, SPARSE_DENSITY)
        if parts is None:
            return None
        indptr, indices, values, c = parts
        height = max(1, BLOCK_ELEMENTS // x.shape[1])
        q = torch.cat([x[i:i + height].pow(2).sum(1) for i in range(0, len(x), height)])
        z = csr(indptr, indices, values, tuple(x.shape))
        return SparseRows(indptr, indices, values, c, q, z, csr_transpose(z))

    def weights_and_margins(self, coef: torch.Tensor, D: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(w [M, n, D'] = coef x, margins [M, N, n] = x[:, :D] w[..., :D]^T) of coef [M, n, N] (D' = D + 1 with
        a bias input: z's last column is 0), through z's nonzeros: x w^T = z w^T + c . w."""
        w = torch.stack([(self.zt @ a.T.contiguous()).T for a in coef]) + coef.sum(2, keepdim=True) * self.c
        margins = torch.stack([self.z @ a.T.contiguous() for a in w]) + (w[..., :D] @ self.c[:D])[:, None, :]
        return w.contiguous(), margins


def independent_svms(x: torch.Tensor, y: torch.Tensor, lam: float | torch.Tensor, mask: torch.Tensor | None = None,
                     bias_reg: float = 1.0, tol: float = 1e-2, max_epochs: int = MAX_EPOCHS
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Independent's solution, one linear SVM per label (``DualCD``), to a relative gap ``tol``, ``max_epochs`` DCD
    epochs or the end of the running time budget: the starting point of a structured learner's fit, at that
    learner's ``bias_reg`` (at bibtex's shape, rho = 1 instead of the L-BFGS learners' 1e-4 made the biases' penalty
    98% of the objective), by continuation where rho < 1.

    x [N, D], y [N, n] (0/1), lam float or [M], mask [M, N] (or None), bias_reg rho > 0. Returns weight [M, n, D],
    bias [M, n] (M = 1 for a float lam) and their objective [M] on x's device and dtype, or None where the fused
    kernel cannot be built (no C++ compiler).
    """
    fitted = _fit_independent(x, y, lam, mask, bias_reg, tol, max_epochs)
    if fitted is None:
        return None
    solver, primal = fitted
    return solver.energy.unary.weight.detach().to(x), solver.energy.unary.bias.detach().to(x), primal.to(x)


def independent_duals(x: torch.Tensor, y: torch.Tensor, lam: float | torch.Tensor, mask: torch.Tensor | None = None,
                      bias_reg: float = 1.0, tol: float = 1e-2, max_epochs: int = MAX_EPOCHS) -> torch.Tensor | None:
    """The dual of Independent's solution (``independent_svms``, same arguments) as fractions of their bound,
    alpha / C in [0, 1]: [M, N, n] on x's device and dtype (0 on the rows a model does not train on; 1: a margin
    violator), or None where the fused kernel cannot be built."""
    fitted = _fit_independent(x, y, lam, mask, bias_reg, tol, max_epochs)
    if fitted is None:
        return None
    solver = fitted[0]
    bound = 1.0 / (solver.lam * solver.count)  # C per model
    return (solver.alpha / bound[:, None, None]).clamp(0.0, 1.0).transpose(1, 2).to(x)


def _fit_independent(x: torch.Tensor, y: torch.Tensor, lam: float | torch.Tensor, mask: torch.Tensor | None,
                     bias_reg: float, tol: float, max_epochs: int) -> tuple[DualCD, torch.Tensor] | None:
    """A ``DualCD`` on Independent's problem fitted to ``tol``, ``max_epochs`` (or the budget's end) and its primal
    [M]; None (with a warning) where the fused kernel cannot be built."""
    n, M = y.shape[1], torch.as_tensor(lam).numel()
    energy = FinleyJoachimsEnergy(x.shape[1], n, Graph.empty(n), num_models=M)
    try:
        solver = DualCD(energy, x, y, torch.as_tensor(lam, dtype=torch.float64).cpu().reshape(M), bias_reg=bias_reg,
                        tol=tol, mask=None if mask is None else mask.cpu())
    except RuntimeError as err:  # the kernel could not be built: the eager passes work, without this start
        log.warning("no start from Independent's solution: %s", err)
        return None
    return solver, solver.fit(max_epochs).primal


@functools.cache
def available() -> bool:
    """Whether the fused kernel of ``DualCD`` builds here (built, or found failing, once per process: the learners'
    ``solver_name`` asks at every step)."""
    try:
        _kernels()
    except RuntimeError:
        return False
    return True


def _kernels():
    """The fused kernels (``svm_dcd``, ``svm_dcd_sparse``), built on first use (saying so); RuntimeError naming the
    missing compiler where they cannot be built."""
    from ..inference import fused

    if not fused.built():
        log.info("building the fused CPU kernels for solver=dcd (first use: a few minutes, then cached in %s)",
                 fused.build_directory())
    return fused.kernels()
