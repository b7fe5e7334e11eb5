"""Progress lines of long phases (``structtorch.progress``): a line when a phase starts, its loops' ticks at most
every ``EVERY_S`` seconds, and what the learners' long phases report (structure learning, TreeCRF's edge scores,
the first epoch of CRANK and Full)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from structtorch import progress
from structtorch.train import run

CONF = Path(__file__).resolve().parents[1] / "conf"
LOGGER = "structtorch.progress"
TINY = ["data.num_train=200", "data.num_test=50", "data.num_labels=4", "trainer.max_epochs=2", "logger=none",
        "trainer.enable_progress_bar=false", "trainer.enable_checkpointing=false"]


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_a_phase_logs_its_start_the_ticks_of_its_loops_and_its_end(caplog, monkeypatch):
    monkeypatch.setattr(progress, "EVERY_S", 0.0)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        progress.tick(1, 2, "steps")  # outside a phase: nothing
        with progress.phase("outer"):
            with progress.phase("inner", quiet=True):
                progress.tick(3, 10, "FISTA iterations", lambda: "gap 0.1")  # computed for a logged line
            progress.tick(7)
    assert lines(caplog) == ["outer: started", "outer > inner: 3/10 FISTA iterations after 0 s (gap 0.1)",
                             "outer: 7 steps after 0 s", "outer: done in 0 s"]


def test_ticks_are_logged_at_most_every_every_s_seconds(caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        with progress.phase("quick"):
            for i in range(1000):
                progress.tick(i, 1000)
    assert lines(caplog) == ["quick: started"]  # no tick within EVERY_S, no end line for a short phase


@pytest.mark.parametrize("model,first", [
    ("tree_crf", ["TreeCRF structure (180 training examples): started",
                  "TreeCRF structure (180 training examples) > inputs of each label (l1): started",
                  "TreeCRF structure (180 training examples) > edge scores (dci) of 6 label pairs: started"]),
    ("crank", ["CRANK (cccp): set-up > start at Independent's solution: started", "CRANK (cccp), epoch 1: started"]),
    ("full", ["Full (lbfgs): set-up > start at Independent's solution: started", "Full (lbfgs), epoch 1: started"]),
    ("rta", ["RTA feature map: 3-fold CV of Independent: started", "RTA interaction_l2=auto: 3-fold CV of one tree: "
             "started", "RTA interaction_l2=auto: 3-fold CV of one tree > start at Independent's solution: started"]),
])
def test_the_long_phases_of_a_run_report_progress(model, first, tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(progress, "EVERY_S", 0.0)  # every tick is logged
    overrides = [*TINY, f"model={model}", *(["model.restarts=2"] if model == "crank" else [])]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        run(cfg, tmp_path)
    logged = lines(caplog)
    assert [line for line in logged if line.endswith(": started")][:len(first)] == first
    units = {"tree_crf": ["Newton iterations"], "crank": ["FISTA iterations"], "full": ["L-BFGS iterations"],
             "rta": ["batches", "rows"]}[model]  # RTA: BCFW's steps, its certificate's pass over the training rows
    for unit in units:
        assert any(f" {unit} after " in line for line in logged), logged


# ---------------------------------------------------------------------- the run's time budget
def test_a_time_budget_turns_tick_and_out_of_time_once_spent(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    assert progress.tick(1) and not progress.out_of_time()  # no budget
    with progress.time_budget(10):
        assert progress.tick(1) and not progress.out_of_time()
        now[0] = 109.9
        assert progress.tick(2)
        with progress.time_budget(None):  # an inner block without a budget
            now[0] = 200.0
            assert progress.tick(3) and not progress.out_of_time()
        assert not progress.tick(4) and progress.out_of_time() and progress.out_of_time(distributed=True)
    assert progress.tick(5) and not progress.out_of_time()  # restored on exit
    with progress.time_budget(10):  # a reserve: out of time that many seconds before the deadline
        now[0] = 205.0
        assert not progress.out_of_time(reserve=4.9) and progress.out_of_time(reserve=5.0)


def test_loops_and_the_greedy_search_stop_when_the_budget_is_spent():
    """A spent budget stops L-BFGS at once (certificate not reached) and Greedy keeps the forest found so far."""
    import torch

    from structtorch.data import crank_synthetic
    from structtorch.learners import Greedy
    from structtorch.learners.baselines import train_forests

    d = crank_synthetic(200, 10, 5, 3, seed=0)
    forests = torch.zeros(1, 10, dtype=torch.bool)
    with progress.time_budget(0):
        solver = train_forests(d.x_train.double(), d.y_train, forests, 0.01)
        model = Greedy(3, 5, l2=0.01)
        model.resolve_l2(200)
        assert not bool(model.build_structure(d.x_train, d.y_train).any())
    assert solver.iterations == 0 and not bool(solver.last.converged.all())
    assert bool(train_forests(d.x_train.double(), d.y_train, forests, 0.01).last.converged.all())


def test_a_budget_share_leaves_the_rest_to_what_follows(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    with progress.budget_share(0.5):  # no budget: no limit
        now[0] = 1e6
        assert not progress.out_of_time()
    now[0] = 100.0
    with progress.time_budget(100):
        now[0] = 120.0
        with progress.budget_share(0.5):  # half of the 80 s left
            now[0] = 159.9
            assert not progress.out_of_time()
            now[0] = 160.0
            assert progress.out_of_time()
        assert not progress.out_of_time()  # the outer budget still has 40 s
    with pytest.raises(ValueError, match="fraction"):
        with progress.budget_share(0.0):
            pass


def test_a_share_deadline_holds_across_calls_and_never_extends_the_budget(monkeypatch):
    """share_deadline fixes the end of a phase that spans several calls (CRANK's search, one CCCP iteration per
    epoch); until() applies it and never lets a phase outlive the running budget."""
    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    assert progress.share_deadline(0.5) is None
    with progress.until(None):
        now[0] = 1e6
        assert not progress.out_of_time()
    now[0] = 0.0
    with progress.time_budget(100):
        deadline = progress.share_deadline(0.5)
        now[0] = 30.0
        with progress.until(deadline):
            assert not progress.out_of_time()
        now[0] = 50.0
        with progress.until(deadline):
            assert progress.out_of_time()
        assert not progress.out_of_time()
        with progress.until(1e6):  # later than the budget: the budget holds
            now[0] = 100.0
            assert progress.out_of_time()


def test_structure_learning_leaves_the_model_half_of_the_budget():
    """MST on tmc2007 spent the whole trainer.time_budget scoring edges, and its tree then trained for no iteration
    (the empty set on every test row): structure learning now stops at half of what is left."""
    import lightning as L
    import torch

    from structtorch.data.datamodule import SyntheticDataModule
    from structtorch.learners import MST
    from structtorch.structure import max_spanning_tree

    dm = SyntheticDataModule(num_train=100, num_test=10, num_labels=4, val_fraction=0.0, seed=0)
    model, seen = MST(dm.num_features, dm.num_labels), []

    def structure(x, y):
        seen.append(progress._DEADLINE.get() - progress.time.monotonic())
        return max_spanning_tree(torch.arange(model.graph.num_edges, dtype=torch.float64), model.graph)

    model.build_structure = structure
    trainer = L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False)
    with progress.time_budget(600):
        trainer.fit(model, datamodule=dm)
    assert len(seen) == 1 and 250 < seen[0] <= 300
