"""The duality-gap certificate every certified solver reports, and the checks that keep it honest.

A certificate is P(w) - D(mu) with P an upper bound on the primal objective at w (an exact or
upper-bounding loss-augmented max) and D a lower bound on the optimum (a dual point in step with the
parameters). Weak duality makes it >= 0 in exact arithmetic, so a value below rounding, or a non-finite
primal or dual, is a bug upstream (overflow, an inexact max, a dual out of step) and raises
``CertificateError``; it is never taken as convergence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["CertificateError", "GapInfo", "certificate", "rounding_tolerance"]


class CertificateError(RuntimeError):
    """A duality gap that cannot be a certificate (negative beyond rounding, or not finite)."""


@dataclass
class GapInfo:
    """Duality gap of the current iterate, per model [M], in float64.

    primal P(w) (an upper bound on the objective), dual D(mu) (a lower bound on its optimum),
    gap = P - D >= P(w) - P*, relative_gap = gap / max(|P|, tiny), converged = relative_gap <= tol;
    rounding_tolerance: the relative gap rounding can explain in the dtype the values were computed in (a tol below
    it certifies only to within rounding).
    """

    primal: torch.Tensor
    dual: torch.Tensor
    gap: torch.Tensor
    relative_gap: torch.Tensor
    converged: torch.Tensor
    rounding_tolerance: float


def rounding_tolerance(dtype: torch.dtype) -> float:
    """The relative gap below zero that rounding can explain for a solve in ``dtype``: 1e-6 in float64, about
    1e-4 in float32 (sums over examples and parameters of values that carry the dtype's error)."""
    return max(1e-6, 1e3 * torch.finfo(dtype).eps)


def certificate(primal: torch.Tensor, dual: torch.Tensor, tol: float, solver: str,
                dtype: torch.dtype = torch.float64) -> GapInfo:
    """``GapInfo`` of primal and dual values [M] (any float dtype; computed in float64), certified where the
    relative gap is <= tol.

    Raises CertificateError naming ``solver``, the model index and the values when a primal or dual is not
    finite, or when a relative gap is below ``-rounding_tolerance(dtype)`` (``dtype``: the precision the values
    were computed in).
    """
    primal, dual = primal.detach().double(), dual.detach().double()
    bad = ~(torch.isfinite(primal) & torch.isfinite(dual))
    if bool(bad.any()):
        m = int(bad.nonzero()[0, 0])
        raise CertificateError(f"{solver}: model {m} has a non-finite certificate (primal {float(primal[m])!r}, "
                               f"dual {float(dual[m])!r}): the objective overflowed or the data hold inf/NaN")
    gap = primal - dual
    rel = gap / primal.abs().clamp_min(torch.finfo(torch.float64).tiny)
    limit = rounding_tolerance(dtype)
    wrong = rel < -limit
    if bool(wrong.any()):
        m = int(wrong.nonzero()[0, 0])
        raise CertificateError(f"{solver}: model {m} has a negative duality gap: primal {float(primal[m]):.9g} < dual "
                               f"{float(dual[m]):.9g} (relative {float(rel[m]):.3g}, beyond the rounding tolerance "
                               f"{limit:.1g}); the primal is not an upper bound or the dual is out of step with "
                               f"the parameters, so this is not a certificate")
    return GapInfo(primal=primal, dual=dual, gap=gap, relative_gap=rel, converged=rel <= tol, rounding_tolerance=limit)
