"""Progress lines for long phases (structure learning, a solver's epoch), through Python logging.

A caller names a phase (``with phase("edge scores (dci) of 15 label pairs"):``); the loops inside it report how far
they are (``tick(37, 100, "FISTA iterations")``), which costs one clock read, and the innermost phase turns that
into a log line at most every ``EVERY_S`` seconds: ``<phase>: 37/100 FISTA iterations after 15 s``. A phase logs
when it starts and, when it took longer than ``EVERY_S``, when it ends (a ``quiet`` one only names the ticks of its
loops). The CLI shows the ``structtorch`` loggers on the console and in train.log; a library user sees them once
logging is configured at INFO.

A run may have a wall-clock budget (``with time_budget(720):``, the CLI's ``trainer.time_budget``): ``tick``
returns False once it is spent, and the loops that tick stop there (``out_of_time`` says the same without a tick).
In a multi-process (distributed) run the loops never stop on their own, since every process must take the same
steps; the learner stops all of them together at an epoch's end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from .threads import retune

__all__ = ["EVERY_S", "OutOfTime", "budget_share", "out_of_time", "phase", "share_deadline", "tick", "time_budget",
           "until"]

EVERY_S = 15.0  #: seconds between two progress lines of a phase, at least
log = logging.getLogger("structtorch.progress")


@dataclass
class _Phase:
    name: str
    start: float = field(default_factory=time.monotonic)
    last: float = field(default_factory=time.monotonic)


_CURRENT: ContextVar[_Phase | None] = ContextVar("structtorch_progress_phase", default=None)
_DEADLINE: ContextVar[float | None] = ContextVar("structtorch_deadline", default=None)  # time.monotonic() value


class OutOfTime(Exception):
    """Raised inside a long interruptible computation (a streamed objective) once the running budget is spent;
    the loop that started it catches it and keeps its last completed step."""


@contextmanager
def time_budget(seconds: float | None) -> Iterator[None]:
    """Inside the block, ``out_of_time()`` (and so ``tick``'s answer) turns once ``seconds`` have passed; None: no
    budget. Blocks nest (the inner one's deadline holds inside it)."""
    deadline = None if seconds is None else time.monotonic() + float(seconds)
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def share_deadline(fraction: float) -> float | None:
    """The ``time.monotonic()`` by which ``fraction`` of the time left of the running ``time_budget`` is spent
    (None: no budget), for a phase that spans several calls (``until``) and leaves the rest to what follows it."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"share_deadline: fraction must lie in (0, 1], got {fraction}")
    deadline = _DEADLINE.get()
    now = time.monotonic()
    return None if deadline is None else now + fraction * max(0.0, deadline - now)


@contextmanager
def until(deadline: float | None) -> Iterator[None]:
    """Inside the block, the running budget ends by ``deadline`` (a ``share_deadline``; None: unchanged)."""
    current = _DEADLINE.get()
    token = _DEADLINE.set(current if deadline is None else deadline if current is None else min(current, deadline))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def budget_share(fraction: float) -> AbstractContextManager[None]:
    """Inside the block, at most ``fraction`` of the time left of the running ``time_budget`` (none: no limit), so
    that a phase leaves the rest to what follows it."""
    return until(share_deadline(fraction))


def out_of_time(distributed: bool = False, reserve: float = 0.0) -> bool:
    """True once the running ``time_budget`` is spent, or has less than ``reserve`` seconds left (kept for work
    that must follow, e.g. a closing certificate). In a multi-process distributed run, False unless
    ``distributed`` (the caller then agrees with the other processes: see the module docstring)."""
    deadline = _DEADLINE.get()
    if deadline is None or time.monotonic() < deadline - reserve:
        return False
    return distributed or not _multi_process()


def _multi_process() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@contextmanager
def phase(name: str, quiet: bool = False) -> Iterator[None]:
    """A long phase named ``name`` (within a running phase: ``<outer> > <name>``): its loops' ``tick``s at most
    every ``EVERY_S`` seconds; unless ``quiet``, a line when it starts and one when it ends if it took longer than
    ``EVERY_S``."""
    outer = _CURRENT.get()
    current = _Phase(name if outer is None else f"{outer.name} > {name}")
    if not quiet:
        log.info("%s: started", current.name)
    token = _CURRENT.set(current)
    try:
        yield
    finally:
        _CURRENT.reset(token)
        took = time.monotonic() - current.start
        if took >= EVERY_S and not quiet:
            log.info("%s: done in %.0f s", current.name, took)


def tick(done: int, total: int | None = None, unit: str = "steps", detail: str | Callable[[], str] = "") -> bool:
    """Report that the innermost running phase has done ``done`` (of ``total``) ``unit``; logged only when
    ``EVERY_S`` seconds have passed since the phase's last line, and only inside a phase. ``detail``: a note
    for the line, or a function computing it (called only for a line that is logged). Returns False once the
    running ``time_budget`` is spent (the loop should stop), else True."""
    going = not out_of_time()
    now = time.monotonic()
    retune(now)  # the thread count follows the machine's load (inside ``threads.follow_load``)
    current = _CURRENT.get()
    if current is None:
        return going
    if now - current.last < EVERY_S:
        return going
    current.last = now
    of = f"/{total}" if total is not None else ""
    detail = detail() if callable(detail) else detail
    log.info("%s: %d%s %s after %.0f s%s", current.name, done, of, unit, now - current.start,
             f" ({detail})" if detail else "")
    return going
