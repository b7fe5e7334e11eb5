"""Fused CPU kernels of the tree passes (``set_fused(True)``): ``csrc/tree_cpu.cpp``, built on first use.

Each pass (MAP, log Z, marginals, max-marginals) is one C++ loop nest over the nodes in leaves-first order,
its inner loops over contiguous batch entries (vectorised), the batch split over torch's threads: one
read of the potentials instead of a few dozen small torch ops per contraction step. The kernels are built
with the system's C++ compiler by ``torch.utils.cpp_extension`` (cached under ``TORCH_EXTENSIONS_DIR``,
default ``~/.cache/torch_extensions``; tens of seconds the first time). CUDA tensors keep the eager (or
compiled) passes, which stay the reference in the tests.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import torch

from ..graph import Schedule

__all__ = ["set_fused"]

_FUSED: dict = {"enabled": False, "module": None}
_ORDERS: dict[int, tuple[Schedule, tuple[torch.Tensor, ...]]] = {}
_SOURCE = Path(__file__).parent / "csrc" / "tree_cpu.cpp"


def set_fused(enabled: bool) -> None:
    """Run tree_map, tree_logz (and its gradient), tree_marginals and tree_max_marginals of CPU tensors
    through the fused C++ kernels (True), or the eager passes (False, the default and the reference; same
    results up to float rounding, MAP up to ties).

    Enabling builds the kernels now (needs a C++ compiler and ninja) and raises RuntimeError if that fails.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"set_fused expects a bool, got {type(enabled).__name__}")
    if enabled:
        kernels()
    _FUSED["enabled"] = enabled


def active(t: torch.Tensor) -> bool:
    """Whether the passes over ``t`` [N, K, B] run fused: enabled, on CPU, a non-empty batch."""
    return _FUSED["enabled"] and t.device.type == "cpu" and t.shape[-1] > 0


def kernels() -> ModuleType:
    """The built extension (built on the first call)."""
    if _FUSED["module"] is None:
        from torch.utils.cpp_extension import load

        try:
            _FUSED["module"] = load(name="structtorch_tree_cpu", sources=[str(_SOURCE)],
                                    extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"])
        except Exception as err:  # noqa: BLE001 - any build failure means the same to the user
            raise RuntimeError(f"set_fused(True): building the fused CPU kernels ({_SOURCE.name}) failed; "
                               f"they need a C++ compiler and ninja. The eager passes still work.") from err
    return _FUSED["module"]


def forest(sched: Schedule) -> tuple[torch.Tensor, ...]:
    """(order, parent, roots, root_group) of a schedule for the kernels; order [C] lists the non-root slots
    with every node after all of its children (a reversed breadth-first order from the roots)."""
    key = id(sched)
    if key not in _ORDERS:  # the schedule is kept with its order: its id stays unique
        parent = sched.parent.tolist()
        children: list[list[int]] = [[] for _ in parent]
        for v, p in enumerate(parent):
            if p >= 0:
                children[p].append(v)
        bfs = sched.roots.tolist()
        for v in bfs:  # grows while iterated: breadth-first
            bfs.extend(children[v])
        order = torch.tensor([v for v in reversed(bfs) if parent[v] >= 0], dtype=torch.long)
        _ORDERS[key] = (sched, (order, sched.parent.contiguous(), sched.roots.contiguous(),
                                sched.root_group.contiguous()))
    return _ORDERS[key][1]
