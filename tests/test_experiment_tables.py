"""The experiments' table writer (``experiments/tables.py``): a rewrite keeps the hand-written provenance section of
the table it replaces (crank_table1's ``--update`` had dropped which runs made which rows); ``matrix_cv``'s
differences to Independent are paired by fold."""

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


def test_matrix_cv_pairs_each_learner_with_independent_by_fold():
    from matrix_cv import with_differences

    rows = [{"dataset": "d", "model": "independent", "subset per fold": "10.00 20.00 30.00",
             "F1 per fold": "50.00 50.00 50.00"},
            {"dataset": "d", "model": "mam", "subset per fold": "12.00 21.00 33.00",
             "F1 per fold": "49.00 51.00 50.00"},
            {"dataset": "e", "model": "mam", "subset per fold": "1.00", "F1 per fold": "2.00"}]
    independent, mam, alone = with_differences(rows)
    assert "subset - independent" not in independent and "subset - independent" not in alone  # nothing to pair with
    assert mam["subset - independent"] == "+2.00 ± 1.15"  # differences 2, 1, 3: sd 1, 2 se = 2 / sqrt(3)
    assert mam["F1 - independent"] == "+0.00 ± 1.15"
