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


def test_the_matrix_finds_every_cached_dataset_by_its_catalog_files(tmp_path, monkeypatch):
    """``python experiments/matrix.py`` without ``--datasets`` runs every dataset whose files are all in the data
    cache, by the catalog's file names (tmc2007's are tmc2007-500-*; a dataset missing a file is left out)."""
    from matrix import cached_datasets

    monkeypatch.setenv("STRUCTTORCH_DATA", str(tmp_path))
    for name, files in {"flags": ["flags-train.arff", "flags-test.arff", "flags.xml"],
                        "tmc2007": ["tmc2007-500-train.arff", "tmc2007-500-test.arff", "tmc2007-500.xml"],
                        "scene": ["scene-train.arff", "scene.xml"]}.items():
        (tmp_path / "mulan" / name).mkdir(parents=True)
        for f in files:
            (tmp_path / "mulan" / name / f).write_text("")
    assert cached_datasets() == ["flags", "tmc2007"]


def test_the_matrix_counts_labels_from_the_label_xml():
    """The label count that picks a cell's time limit comes from the dataset's XML, not from its rows loaded into the
    process that forks every cell (whose resident memory Linux counts in each cell's peak)."""
    from conftest import cached_mulan
    from matrix import label_count

    cached_mulan("flags", "test")  # skips without the data cache
    assert label_count("flags") == 7


def test_the_matrix_says_why_a_run_has_no_certificate():
    """A run without a certificate says why in its matrix cell: its steps' searches certified none of their rows
    (``BCFWStrategy.uncertifiable``'s reason, as the strategy writes it), or the pass would not fit the budget."""
    import types

    from matrix import structtorch_cells

    from structtorch.solvers.bcfw import EnsembleOracle
    from structtorch.strategies.certified import BCFWStrategy

    oracle = EnsembleOracle(8, 32)
    oracle.searches = 64  # none certified
    strategy = types.SimpleNamespace(solver=types.SimpleNamespace(oracle=oracle, step_oracle=oracle), search_stats={})
    strategy._counting_oracles = lambda: BCFWStrategy._counting_oracles(strategy)
    metrics = {"test/hamming_acc": 0.9, "test/subset_acc": 0.5, "test/example_f1": 0.6, "train_seconds": 1.0}
    for why, cell in ((BCFWStrategy.uncertifiable(strategy), "the steps' searches certified no row"),
                      ("not computed: its pass over the training set would take about 900 s", "past the time budget")):
        assert structtorch_cells(metrics | {"solver": {"certificate": why, "converged": False}})["gap"] == (
            f"NOT certified (no certificate: {cell})")
