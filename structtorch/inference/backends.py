"""Which implementation runs the tree passes (tree_map, tree_logz and its gradient, tree_marginals,
tree_max_marginals) and smoothed_lp:

- ``"eager"``: batched torch ops; the default and the reference of every test;
- ``"compile"``: the tree passes through ``torch.compile``, one program per schedule and pass (``inference.tree``);
- ``"fused"``: hand-written C++ kernels for CPU tensors (``inference.fused``); CUDA tensors keep the eager passes.

``with backend("fused"): ...`` chooses one for a block: a context variable, restored when the block exits (on an
error too) and private to the thread or task that entered it, so no run leaves its choice to the next one.
``set_backend`` sets the process default that code outside any block uses.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from . import fused

__all__ = ["BACKENDS", "backend", "current_backend", "fused_active", "set_backend"]

BACKENDS = ("eager", "compile", "fused")
_default = {"name": "eager"}
_chosen: ContextVar[str | None] = ContextVar("structtorch_backend", default=None)


def check_backend(name: object) -> str:
    """``name`` if it is one of ``BACKENDS`` (building the fused kernels now for ``"fused"``, so a missing
    compiler fails here, not inside a run), else ValueError."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    if name == "fused":
        fused.kernels()
    return str(name)


def current_backend() -> str:
    """The backend in force here: the innermost ``backend(...)`` block's, else the process default."""
    chosen = _chosen.get()
    return _default["name"] if chosen is None else chosen


@contextmanager
def backend(name: str) -> Iterator[str]:
    """Run the inference ops of the block on backend ``name`` (one of ``BACKENDS``)."""
    token = _chosen.set(check_backend(name))
    try:
        yield name
    finally:
        _chosen.reset(token)


def set_backend(name: str) -> None:
    """Set the process default backend (``"eager"`` unless set): what code outside a ``backend`` block uses."""
    _default["name"] = check_backend(name)


def fused_active(t: torch.Tensor) -> bool:
    """Whether the passes over ``t`` [..., B] run fused: backend "fused", a CPU float32/64 tensor, B > 0."""
    return (current_backend() == "fused" and t.device.type == "cpu" and t.dtype in (torch.float32, torch.float64)
            and t.shape[-1] > 0)
