"""Fused CPU kernels (``backend("fused")``) of the tree passes (``csrc/tree_cpu.cpp``), of the K-best lists of
RTA's ensembles (``csrc/kbest_cpu.cpp``: ``tree_kbest`` and ``ensemble_map``'s candidate scores), of the
smoothed-LP sweeps (``csrc/lp_cpu.cpp``) and of the per-label linear SVMs' dual coordinate descent
(``csrc/dcd_cpu.cpp``, ``structtorch.solvers.DualCD``), built on first use.

Each tree pass (MAP, log Z, marginals, max-marginals) is one C++ loop nest over the nodes in leaves-first
order that reads the potentials once; ``smoothed_lp`` runs its star-update sweeps, each problem's stopping
rule, the dual value and the pseudo-marginals in one kernel call. In both, the batch is split over
torch's threads and into cache-sized chunks, transposed to batch-minor buffers whose inner loops are SIMD
loops over the chunk's entries (ATen's ``Vectorized``, SLEEF's exp and log), and the outputs are written in
the caller's layout. The kernels are built with the system's C++ compiler by ``torch.utils.cpp_extension``
for the CPU's vector extension (AVX2 + FMA where torch reports AVX2 or AVX-512, else portable code; a few
minutes the first time, then cached per checkout and torch installation: ``build_directory()``). CUDA
tensors keep the eager (or compiled) passes, which stay the reference in the tests.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import time
import warnings
from pathlib import Path
from types import ModuleType

import torch

from ..graph import Schedule

__all__ = ["build_directory", "built", "forest", "kernels"]

_BUILT: dict[str, ModuleType | RuntimeError | None] = {"module": None, "error": None}
_SOURCES = [Path(__file__).parent / "csrc" / name
            for name in ("tree_cpu.cpp", "kbest_cpu.cpp", "lp_cpu.cpp", "dcd_cpu.cpp", "module.cpp")]


def _name() -> str:
    avx2 = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    return "structtorch_cpu" + ("_avx2" if avx2 else "")


def build_directory() -> Path:
    """Where this copy of the package builds and caches its kernels: a folder of torch's extensions cache
    (``TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``) named after the sources' location and the
    torch installation, so two checkouts or environments never rebuild over each other's build."""
    from torch.utils.cpp_extension import get_default_build_root

    key = hashlib.sha1(f"{_SOURCES[0].parent}|{torch.__file__}|{torch.__version__}".encode()).hexdigest()[:12]
    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()) / f"{_name()}-{key}"


def built() -> bool:
    """Whether the kernels are loaded in this process or built in ``build_directory()`` (then ``kernels()``
    loads them in about a second; otherwise it compiles them, a few minutes)."""
    return _BUILT["module"] is not None or any(build_directory().glob(f"{_name()}*.so"))


def kernels() -> ModuleType:
    """The built extension (built on the first call)."""
    if _BUILT["error"] is not None:  # a failed build is not tried again in this process
        raise _BUILT["error"]
    if _BUILT["module"] is None:
        from torch.utils.cpp_extension import load

        arch = ["-mavx2", "-mfma", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"] if _name().endswith("avx2") \
            else ["-DCPU_CAPABILITY=DEFAULT"]
        flags = ["-O3", "-fopenmp", *arch]
        try:
            folder = build_directory()
            folder.mkdir(parents=True, exist_ok=True)
            stamp, fingerprint = folder / "sources.sha1", _fingerprint(flags)
            _BUILT["module"] = _load_built(folder) if _read(stamp) == fingerprint else None
            if _BUILT["module"] is None:
                _clear_stale_lock(folder / "lock")
                _BUILT["module"] = load(name=_name(), sources=[str(s) for s in _SOURCES], build_directory=str(folder),
                                        extra_cflags=flags, extra_ldflags=["-fopenmp"])
                stamp.write_text(fingerprint)
        except Exception as err:  # noqa: BLE001 - any build failure means the same to the user
            _BUILT["error"] = RuntimeError(f"backend 'fused': building the fused CPU kernels ({_SOURCES[0].parent}) "
                                           f"failed; they need a C++ compiler and ninja. The eager passes still work.")
            raise _BUILT["error"] from err
    return _BUILT["module"]


def _fingerprint(flags: list[str]) -> str:
    """A hash of the kernels' sources (every file of csrc/) and build flags."""
    digest = hashlib.sha1(" ".join(flags).encode())
    for path in sorted(_SOURCES[0].parent.iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _load_built(folder: Path) -> ModuleType | None:
    """The extension built in ``folder`` from today's sources (its ``sources.sha1`` says so), loaded without
    torch's build lock: torch's loader takes the lock on every load, so a process killed while loading (a
    timeout's SIGKILL) used to leave every later run waiting. None where it does not load: torch's loader then
    builds it."""
    spec = importlib.util.spec_from_file_location(_name(), folder / f"{_name()}.so")
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (OSError, ImportError):
        return None
    return module


#: a build lock older than this is stale: torch's loader takes it on every load (a build here takes ~3 min), and a
#: process killed while holding it (a timeout's SIGKILL) would leave every later run waiting for it, silently
STALE_LOCK_SECONDS = 900.0


def _clear_stale_lock(lock: Path) -> None:
    """Remove torch's build lock ``lock`` when it is older than ``STALE_LOCK_SECONDS``, saying so once."""
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > STALE_LOCK_SECONDS:
        warnings.warn(f"backend 'fused': removing a stale build lock {lock} ({age / 60:.0f} min old, left by a "
                      f"process that was killed while loading the kernels)", stacklevel=3)
        lock.unlink(missing_ok=True)


def forest(sched: Schedule) -> tuple[torch.Tensor, ...]:
    """(order, parent, parent_edge, flip, roots, root_group) of a schedule for the kernels, kept with the
    schedule; order [C] lists the non-root slots with every node after all of its children (a reversed
    breadth-first order from the roots), flip [N] (bool) marks the slots whose parent edge is stored as
    (x_v, x_parent)."""
    if "fused" not in sched.memo:
        parent = sched.parent.tolist()
        children: list[list[int]] = [[] for _ in parent]
        for v, p in enumerate(parent):
            if p >= 0:
                children[p].append(v)
        bfs = sched.roots.tolist()
        for v in bfs:  # grows while iterated: breadth-first
            bfs.extend(children[v])
        order = torch.tensor([v for v in reversed(bfs) if parent[v] >= 0], dtype=torch.long)
        flip = torch.zeros(len(parent), dtype=torch.bool).index_fill_(0, sched.flipped.cpu(), True)
        arrays = (sched.parent, sched.parent_edge, flip, sched.roots, sched.root_group)
        sched.memo["fused"] = (order, *(a.cpu().contiguous() for a in arrays))
    return sched.memo["fused"]
