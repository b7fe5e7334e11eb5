"""Result tables of the experiments: one list of row dicts -> <out>.csv and a markdown <out>.md."""

from __future__ import annotations

import csv
from pathlib import Path


def write_table(rows: list[dict], out: Path, columns: list[str] | None = None, footer: list[str] = ()) -> None:
    """Write ``rows`` to ``out``.csv (every key) and ``out``.md (``columns``, default every key, then
    ``footer`` lines), and print the markdown."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    keys = columns or list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows]
    text = "\n".join([*lines, *footer]) + "\n"
    out.with_suffix(".md").write_text(text)
    print(text)
