"""The run index: how ``ckpt_path=last`` finds the earlier run of the same configuration, wherever it was started.

Every single run of ``python -m structtorch.train`` (not the jobs of a ``-m`` sweep) appends one line to
``runs.jsonl`` in the cache folder (``$STRUCTTORCH_RUNS``, default ``$STRUCTTORCH_DATA``, default
``~/.cache/structtorch``): its directory, its resume key and the checkpoint it resumed from. A run started from
another directory is found there; runs under this run's output folder (``outputs/`` of the current directory) are
searched too, so older runs and a read-only cache still work.

The resume key is the run's whole resolved configuration except ``RUN_ONLY``: what does not change the model being
trained. ``ckpt_path`` / ``resume`` say how a run starts, ``trainer.max_epochs`` and ``trainer.time_budget`` are
caps (raising one is why one resumes), the progress bar, logging interval, logger, checkpointing and ``test`` change
what a run shows or writes, and the accelerator, devices, nodes, strategy, threads, ``fused`` and
``data.num_workers`` change where and how fast it runs (DDP splits the same global batch; the fused kernels equal
the eager passes). Everything else must be equal, the data's ``root`` compared as an absolute path.

Among the runs whose key equals this run's and that hold ``checkpoints/last.ckpt``, a run that a later one resumed
is superseded by it; exactly one must remain, or ``ckpt_path=last`` refuses, listing the candidates.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from .data.download import mulan_cache_dir

__all__ = ["RUN_ONLY", "find_last_checkpoint", "record_run", "resume_key", "runs_index"]

log = logging.getLogger("structtorch.runs")

RUN_ONLY = frozenset({
    "ckpt_path", "resume", "logger", "test", "fused", "data.num_workers", "trainer.max_epochs", "trainer.time_budget",
    "trainer.enable_progress_bar", "trainer.log_every_n_steps", "trainer.enable_checkpointing", "trainer.accelerator",
    "trainer.devices", "trainer.num_nodes", "trainer.strategy", "trainer.num_threads",
})
CHECKPOINT = Path("checkpoints") / "last.ckpt"


def runs_index() -> Path:
    """The run index file: ``$STRUCTTORCH_RUNS`` if set, else ``runs.jsonl`` in the data cache folder."""
    return Path(os.path.expanduser(os.environ.get("STRUCTTORCH_RUNS") or mulan_cache_dir() / "runs.jsonl"))


def resume_key(cfg: DictConfig | dict[str, Any], cwd: Path | None = None) -> dict[str, Any]:
    """The configuration a resumed run must share, flattened to ``{"model.l2": 0.1, ...}`` (without ``RUN_ONLY``);
    a relative ``data.root`` is made absolute against ``cwd`` (default: the current directory)."""
    container = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    key = {k: v for k, v in _flatten(container) if k not in RUN_ONLY}
    if key.get("data.root") is not None:
        key["data.root"] = str((cwd or Path.cwd()) / os.path.expanduser(str(key["data.root"])))
    return key


def _flatten(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _flatten(v, f"{prefix}{k}.")
    else:
        yield prefix[:-1], node


def record_run(out: Path, cfg: DictConfig, resumed_from: str | None) -> None:
    """Append run ``out`` to the run index (a warning, not an error, when the index cannot be written)."""
    entry = {"run": str(out.resolve()), "key": resume_key(cfg),
             "resumed_from": None if resumed_from is None else str(Path(resumed_from).resolve())}
    index = runs_index()
    try:
        index.parent.mkdir(parents=True, exist_ok=True)
        with open(index, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
    except OSError as err:
        log.warning("could not add this run to the run index %s (%s): ckpt_path=last from another directory will "
                    "not find it; resume=%s will", index, err, entry["run"])


def find_last_checkpoint(cfg: DictConfig, out: Path, output_base: Path) -> str:
    """``checkpoints/last.ckpt`` of the one earlier run of ``cfg``'s configuration (see the module docstring);
    ValueError, listing the candidates, when there is none or more than one."""
    key, here = resume_key(cfg), out.resolve()
    runs = {run: e for run, e in _known_runs(output_base).items() if run != here and (run / CHECKPOINT).is_file()}
    same = {run: entry for run, entry in runs.items() if entry["key"] == key}
    superseded = {Path(e["resumed_from"]).parent.parent for e in same.values() if e.get("resumed_from")}
    leaves = sorted((run for run in same if run not in superseded), key=_saved_at)
    where = f"searched the run index {runs_index()} and {output_base}"
    if len(leaves) == 1:
        return str(leaves[0] / CHECKPOINT)
    if leaves:
        listed = ", ".join(f"{run} (saved {_when(run)})" for run in leaves)
        raise ValueError(f"ckpt_path=last: {len(leaves)} earlier runs of this configuration have a checkpoint: "
                         f"{listed}; pass resume=<run dir> to choose one")
    named = f"model={key.get('model.name')} on {key.get('data.name') or key.get('data.kind')}"
    near = sorted((run for run, e in runs.items() if _same_model_and_data(e["key"], key)), key=_saved_at)[-3:]
    differ = "".join(f"; {run} differs in {_differences(runs[run]['key'], key)}" for run in reversed(near))
    raise ValueError(f"ckpt_path=last: no earlier run of this configuration ({named}) has {CHECKPOINT} ({where})"
                     f"{differ}; pass resume=<run dir> to continue a run of another configuration")


def _known_runs(output_base: Path) -> dict[Path, dict[str, Any]]:
    """Run dir -> index entry: the index's runs, then the single runs under ``output_base`` it lacks."""
    runs: dict[Path, dict[str, Any]] = {}
    index = runs_index()
    if index.is_file():
        for line in index.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
                runs[Path(entry["run"])] = entry
            except (ValueError, KeyError, TypeError):  # a line cut by a crash: skip it
                continue
    for ckpt in output_base.glob(f"**/{CHECKPOINT}"):
        run = ckpt.parent.parent.resolve()
        saved = run / ".hydra" / "config.yaml"
        if run not in runs and saved.is_file() and not (run.parent / "multirun.yaml").is_file():
            runs[run] = {"run": str(run), "key": resume_key(OmegaConf.load(saved))}
    return runs


def _same_model_and_data(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in ("model.name", "data.kind", "data.name"))


def _differences(theirs: dict[str, Any], ours: dict[str, Any], most: int = 3) -> str:
    keys = sorted(k for k in theirs.keys() | ours.keys() if theirs.get(k) != ours.get(k))
    shown = ", ".join(f"{k}={theirs.get(k)} (this run: {ours.get(k)})" for k in keys[:most])
    return shown + (f" and {len(keys) - most} more" if len(keys) > most else "")


def _saved_at(run: Path) -> float:
    return (run / CHECKPOINT).stat().st_mtime


def _when(run: Path) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(_saved_at(run)))
