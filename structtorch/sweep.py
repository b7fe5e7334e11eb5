"""Sweep summary: after a ``-m`` multirun, one table (CSV + markdown) of every job, failed ones included.

Registered as a Hydra callback in ``conf/config.yaml``. Each job directory holds ``.hydra/overrides.yaml``
and either ``metrics.json`` (written by ``structtorch.train.run``) or ``error.txt`` (its error line).
The table is written to ``<sweep dir>/summary.csv`` and ``summary.md`` and printed; the process exits
with code 1 when a job failed.
"""

from __future__ import annotations

import csv
import json
import logging
import sys
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

__all__ = ["SweepSummary", "summarize_sweep"]

log = logging.getLogger("structtorch.sweep")
COLUMNS = ("test/hamming_acc", "test/subset_acc", "test/example_f1", "train_seconds")


def summarize_sweep(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """One row per job directory under ``sweep_dir``: job, overrides, status, metrics or error.
    Writes ``summary.csv`` and ``summary.md`` there."""
    sweep = Path(sweep_dir)
    rows = []
    for job in sorted((p.parent.parent for p in sweep.glob("*/.hydra/overrides.yaml")), key=_job_order):
        overrides = " ".join(yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()) or [])
        row: dict[str, Any] = {"job": job.name, "overrides": overrides}
        if (job / "metrics.json").is_file():
            metrics = json.loads((job / "metrics.json").read_text())
            row["status"] = "ok"
            row.update({c: metrics.get(c) for c in COLUMNS})
            row["error"] = ""
        else:
            error = (job / "error.txt").read_text().strip().splitlines() if (job / "error.txt").is_file() else []
            row["status"] = "failed"
            row.update({c: None for c in COLUMNS})
            row["error"] = error[0] if error else "no metrics.json (the job did not finish)"
        rows.append(row)
    fields = ["job", "overrides", "status", *COLUMNS, "error"]
    with open(sweep / "summary.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    (sweep / "summary.md").write_text(_markdown(rows, fields))
    return rows


def _job_order(path: Path) -> tuple[int, str]:
    return (int(path.name), "") if path.name.isdigit() else (sys.maxsize, path.name)


def _markdown(rows: list[dict[str, Any]], fields: list[str]) -> str:
    def cell(key: str, value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, float):
            return f"{value:.2f}" if key.endswith("seconds") else f"{100 * value:.2f}"
        return str(value).replace("|", "\\|")

    head = [f.replace("test/", "") + (" %" if f.startswith("test/") else "") for f in fields]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(fields)]
    lines += ["| " + " | ".join(cell(f, r.get(f)) for f in fields) + " |" for r in rows]
    return "\n".join(lines) + "\n"


class SweepSummary(Callback):
    """Hydra callback: summarise the sweep directory when a multirun ends."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = Path(config.hydra.sweep.dir)
        if not sweep.is_dir():
            return
        rows = summarize_sweep(sweep)
        failed = [r for r in rows if r["status"] != "ok"]
        print(f"\nsweep summary ({len(rows)} jobs, {len(failed)} failed): {sweep / 'summary.md'}\n"
              f"{(sweep / 'summary.md').read_text()}", flush=True)
        if failed:
            sys.exit(1)
