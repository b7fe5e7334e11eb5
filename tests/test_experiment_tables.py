"""The experiments' table writer (``experiments/tables.py``): a rewrite keeps the hand-written provenance section of
the table it replaces (crank_table1's ``--update`` had dropped which runs made which rows)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from tables import PROVENANCE, write_table  # noqa: E402


def test_a_rewritten_table_keeps_its_provenance_section(tmp_path):
    out = tmp_path / "table"
    write_table([{"model": "a", "score": 1}], out, footer=["generated footer"])
    text = out.with_suffix(".md").read_text()
    assert "generated footer" in text and PROVENANCE not in text  # no section: nothing to keep
    out.with_suffix(".md").write_text(text + f"\n{PROVENANCE}\n\nRun 1: `python x.py`, alone.\n")
    write_table([{"model": "a", "score": 2}, {"model": "b", "score": 3}], out, footer=["generated footer"])
    text = out.with_suffix(".md").read_text()
    assert "| b | 3 |" in text and "| a | 1 |" not in text  # the new rows
    assert text.count(PROVENANCE) == 1 and text.endswith(f"{PROVENANCE}\n\nRun 1: `python x.py`, alone.\n")
    assert text.index("generated footer") < text.index(PROVENANCE)
