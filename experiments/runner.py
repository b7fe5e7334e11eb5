"""How the experiments run structtorch: a Hydra config composed from ``conf/`` with overrides, trained and tested by
``structtorch.train.run`` (the code path of ``python -m structtorch.train <overrides>``), and cross-validation on
the package's folds (``data.num_folds`` / ``data.fold``: ``structtorch.data.kfold_indices``)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from structtorch.train import run

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["logger=none", "trainer.enable_progress_bar=false"]  # first: an experiment's overrides win
UNBOUNDED = ["trainer.time_budget=null"]  # a paper's protocol runs to its own stopping rule, not the CLI's budget
T = TypeVar("T")


def compose_config(overrides: list[str]) -> DictConfig:
    """``conf/config.yaml`` composed with ``overrides``, without logger, progress bar or time budget."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=[*QUIET, *UNBOUNDED, *overrides])


def run_config(overrides: list[str], out: Path | None = None) -> dict[str, Any]:
    """The metrics of ``structtorch.train.run`` on ``compose_config(overrides)``: run in ``out`` (checkpoints kept
    there), or without checkpoints in a temporary directory."""
    if out is not None:
        return run(compose_config(overrides), out)
    with tempfile.TemporaryDirectory() as tmp:
        return run(compose_config([*overrides, "trainer.enable_checkpointing=false"]), Path(tmp))


def run_folds(overrides: list[str], folds: int) -> list[dict[str, Any]]:
    """``run_config`` on each fold k of ``data.num_folds=folds``: trained on the other folds, tested on fold k."""
    return [run_config([*overrides, f"data.num_folds={folds}", f"data.fold={k}"]) for k in range(folds)]


def choose_by_cv(grid: Sequence[T], fold_scores: Callable[[T], list[float]]) -> tuple[T, list[float]]:
    """The value of ``grid`` whose fold scores have the highest mean (the first on ties), and every value's mean."""
    means = [sum(s) / len(s) for s in map(fold_scores, grid)]
    return grid[max(range(len(grid)), key=lambda i: (means[i], -i))], means
