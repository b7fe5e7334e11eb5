"""The Hydra entry point: every config combination composes (and a typo fails), ``run`` writes
metrics.json, checkpoint-resume reproduces an uninterrupted run, and the real CLI (single run,
basic-launcher multirun, missing dataset) works as a subprocess."""

from __future__ import annotations

import csv
import dataclasses
import inspect
import itertools
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from structtorch.config import ModelConfig, TrainerConfig
from structtorch.graph import Graph
from structtorch.learners import LEARNERS, M3N, FixedTree, Independent, StructuredLearner
from structtorch.solvers.certificate import rounding_tolerance
from structtorch.structure.edge_scores import chow_liu_tree
from structtorch.train import (
    UserError,
    build_datamodule,
    build_learner,
    format_metrics,
    run,
    run_backend,
    world_size,  # registers the schemas
)

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
MULAN = (REPO / ".." / "shared" / "data" / "mulan").resolve()  # the default data.root, from the repo root


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


MODELS, TRAINERS = options("model"), options("trainer")
DATA = options("data") + ["scene", "emotions", "yeast", "medical"]  # every Mulan catalog name is a data config
EXPERIMENTS = options("experiment") if (CONF / "experiment").is_dir() else []
CONFIG_ERRORS = (ConfigCompositionException, ConfigKeyError, ValidationError)
SMALL = ["data.num_train=200", "data.num_test=100", "data.num_labels=5", "trainer.max_epochs=2",
         "trainer.enable_progress_bar=false", "trainer.enable_checkpointing=false", "trainer.log_every_n_steps=1"]

pytestmark = [pytest.mark.usefixtures("quiet_single_thread"),
              pytest.mark.filterwarnings("ignore:.*does not have many workers"),
              pytest.mark.filterwarnings("ignore:.*LeafSpec"),
              pytest.mark.filterwarnings("ignore:.*log_every_n_steps"),
              pytest.mark.filterwarnings("ignore:.*Checkpoint directory .* exists and is not empty"),
              pytest.mark.filterwarnings("ignore:The dirpath has changed")]


def compose_cfg(overrides: list[str], config_dir: Path = CONF) -> DictConfig:
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return compose("config", overrides=overrides)


def small_cfg(*overrides: str) -> DictConfig:
    return compose_cfg([*SMALL, *overrides])


# ---------------------------------------------------------------------- (a) compose every config
def test_config_groups_are_not_empty():
    from hydra.core.config_store import ConfigStore

    from structtorch.data import mulan_datasets

    assert {"independent", "fixed_tree"} <= set(MODELS)
    assert {"synthetic", "mulan"} <= set(DATA)
    registered = {name.removesuffix(".yaml") for name in ConfigStore.instance().list("data")}
    assert set(mulan_datasets()) <= registered and {"scene", "emotions", "yeast", "medical"} <= registered
    assert {"cpu", "gpu", "ddp"} <= set(TRAINERS)


@pytest.mark.parametrize("model,data,trainer", list(itertools.product(MODELS, DATA, TRAINERS)))
def test_every_config_combination_composes(model, data, trainer, monkeypatch):
    monkeypatch.delenv("STRUCTTORCH_MULAN_ROOT", raising=False)
    overrides = [f"model={model}", f"data={data}", f"trainer={trainer}"]
    if data == "mulan":
        overrides.append("data.name=emotions")
    cfg = compose_cfg(overrides)
    # everything resolves, nothing is missing
    container = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert set(container) >= {"model", "data", "trainer", "seed", "ckpt_path", "logger", "test"}
    # model: a registered learner, and every option is an argument of its constructor
    assert cfg.model.name in LEARNERS
    cls = LEARNERS[cfg.model.name]
    params = set().union(*(inspect.signature(c.__init__).parameters for c in cls.__mro__
                           if isinstance(c, type) and issubclass(c, StructuredLearner)))
    assert {f.name for f in dataclasses.fields(ModelConfig)} <= set(cfg.model)
    assert set(cfg.model) - {"name", "tree"} <= params  # "tree" becomes FixedTree's edges in build_learner
    # data
    assert cfg.data.kind in ("mulan", "synthetic", "tree_crf_synthetic", "denoising", "segmentation")
    assert isinstance(cfg.data.batch_size, int) and cfg.data.batch_size >= 1
    if cfg.data.kind in ("mulan", "segmentation"):
        assert cfg.data.name == (data if data != "mulan" else "emotions")
        assert cfg.data.root is None  # default: the download cache ($STRUCTTORCH_DATA), nothing outside the project
    # trainer: exactly the schema's fields, all of them lightning.Trainer arguments
    assert set(cfg.trainer) == {f.name for f in dataclasses.fields(TrainerConfig)}
    own = {"num_threads", "time_budget"}  # structtorch's, applied around the Trainer (config.TrainerConfig)
    assert set(cfg.trainer) - own <= set(inspect.signature(L.Trainer.__init__).parameters)
    assert world_size(cfg.trainer) == (2 if trainer == "ddp" else 1)
    if trainer == "ddp":
        assert cfg.trainer.strategy == "ddp" and cfg.trainer.accelerator == "cpu" and cfg.trainer.devices == 2
    if trainer == "gpu":
        assert cfg.trainer.accelerator == "gpu"


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_config_composes(experiment, monkeypatch):
    monkeypatch.delenv("STRUCTTORCH_MULAN_ROOT", raising=False)
    cfg = compose_cfg([f"+experiment={experiment}"])
    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert cfg.model.name in LEARNERS and cfg.data.kind in ("mulan", "synthetic", "tree_crf_synthetic")


GRID_SMALL = ["data=denoising", "data.num_train=2", "data.num_test=2", "data.height=5", "data.width=6"]


@pytest.mark.parametrize("model", MODELS)
def test_every_model_config_builds_a_learner(model):
    grid = LEARNERS[compose_cfg([f"model={model}"]).model.name].grid_inputs  # grid images, not vectors
    cfg = compose_cfg([f"model={model}", *GRID_SMALL]) if grid else small_cfg(f"model={model}")
    dm = build_datamodule(cfg.data)
    learner = build_learner(cfg.model, dm)
    assert isinstance(learner, LEARNERS[cfg.model.name])
    assert learner.hparams.num_features == dm.num_features and learner.hparams.num_labels == dm.num_labels
    for key in set(ModelConfig.__dataclass_fields__) - {"name"}:
        if key == "margin":  # RTA resolves "auto" by the label count and density (the hparam stays "auto")
            assert learner.margin in ("hamming", "zero_one")
        assert learner.hparams[key] == cfg.model[key]


@pytest.mark.parametrize("model", [name for name, cls in LEARNERS.items() if issubclass(cls, M3N)])
def test_m3n_learners_default_to_spin_couplings(model):
    """model.spin is true by default for every Finley-Joachims learner and reaches its energy;
    model.spin=false gives the paper's w_ij y_i y_j."""
    cfg = small_cfg(f"model={model}")
    dm = build_datamodule(cfg.data)
    learner = build_learner(cfg.model, dm)
    assert cfg.model.spin is True and learner.hparams.spin and learner.energy.spin
    assert not build_learner(small_cfg(f"model={model}", "model.spin=false").model, dm).energy.spin


@pytest.mark.parametrize("override", ["model.lrr=0.1", "trainer.max_epoch=3", "data.num_trian=10", "seeed=1",
                                      "model.tree=chain", "model.lr=abc", "trainer.max_epochs=many",
                                      "data.name=emotions"])
def test_typo_in_override_raises_config_error(override):
    # model.tree does not exist for model=independent; data.name does not exist for data=synthetic
    with pytest.raises(CONFIG_ERRORS):
        compose_cfg(["model=independent", "data=synthetic", override])


def test_unknown_group_option_raises():
    with pytest.raises(MissingConfigException):
        compose_cfg(["trainer=nope"])


def test_typo_in_a_yaml_file_raises_config_error(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "model" / "typo.yaml").write_text("defaults:\n  - /model_schema@_here_\nname: independent\nlrr: 0.1\n")
    (conf / "trainer" / "typo.yaml").write_text("defaults:\n  - /trainer_schema@_here_\nmax_epoch: 3\n")
    assert compose_cfg(["model=independent"], conf).model.name == "independent"  # the copy itself is fine
    with pytest.raises(CONFIG_ERRORS, match="lrr"):
        compose_cfg(["model=typo"], conf)
    with pytest.raises(CONFIG_ERRORS, match="max_epoch"):
        compose_cfg(["trainer=typo"], conf)


# ---------------------------------------------------------------------- build_datamodule / build_learner
def test_batch_size_is_global_and_split_across_processes():
    cfg = small_cfg("data.batch_size=64")
    assert build_datamodule(cfg.data).batch_size == 64
    assert build_datamodule(cfg.data, processes=2).batch_size == 32
    assert build_datamodule(cfg.data, processes=4).batch_size == 16
    with pytest.raises(ValueError, match="batch_size"):
        build_datamodule(small_cfg("data.batch_size=63").data, processes=2)


def test_build_datamodule_rejects_an_unknown_kind():
    with pytest.raises(ValueError, match="data.kind"):
        build_datamodule(small_cfg("data.kind=csv").data)


def _pairs(g: Graph) -> set:
    return {tuple(sorted(e)) for e in g.edges.tolist()}


@pytest.mark.parametrize("tree", ["chain", "star", "empty", "chow_liu"])
def test_fixed_tree_builds_its_tree_from_the_training_data_when_fitted(tree, tmp_path):
    cfg = small_cfg("model=fixed_tree", f"model.tree={tree}", "trainer.max_epochs=1")
    dm = build_datamodule(cfg.data)
    learner = build_learner(cfg.model, dm)
    assert isinstance(learner, FixedTree)
    with pytest.raises(RuntimeError, match="Trainer.fit"):  # no tree before fit
        learner(dm.train_tensors[0][:2])
    n = dm.num_labels
    expected = {"chain": Graph.chain(n), "star": Graph.star(n), "empty": Graph.empty(n),
                "chow_liu": chow_liu_tree(dm.train_tensors[1])}[tree]
    L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              default_root_dir=tmp_path).fit(learner, datamodule=dm)
    assert _pairs(learner.graph) == _pairs(expected) and learner.graph.is_forest
    assert learner.energy.edge_weight.shape == (expected.num_edges,)
    names = learner.structure_summary()
    assert names["num_edges"] == expected.num_edges
    assert {tuple(sorted(e[:2])) for e in names["edges"]} == {tuple(sorted((f"y{a}", f"y{b}"))) for a, b in
                                                                 expected.edges.tolist()}


def test_build_learner_rejects_unknown_tree_and_model_name():
    cfg = small_cfg("model=fixed_tree", "model.tree=wheel")
    dm = build_datamodule(cfg.data)
    with pytest.raises(ValueError, match="model.tree"):
        build_learner(cfg.model, dm)
    cfg = small_cfg("model.name=crankk")
    with pytest.raises(ValueError, match="model.name"):
        build_learner(cfg.model, dm)


# ---------------------------------------------------------------------- (b) run() writes metrics.json
@pytest.mark.parametrize("overrides", [["model=independent"], ["model=fixed_tree"],
                                       ["model=fixed_tree", "model.tree=chain", "logger=csv", "model.loss=crf"]])
def test_run_writes_metrics_json(overrides, tmp_path):
    cfg = small_cfg(*overrides)
    metrics = run(cfg, tmp_path)
    run_name = f"{cfg.model.name}-synthetic"
    if cfg.logger == "tensorboard":  # the default logger: one run per model/data, structure picture logged
        events = list((tmp_path / run_name).glob("events.out.tfevents.*"))
        assert events
        tags = _tensorboard_tags(tmp_path / run_name)
        assert {"structure", "test/per_label", "hp_metric"} <= tags, tags
    assert (tmp_path / "structure.png").stat().st_size > 0 and (tmp_path / "per_label.png").stat().st_size > 0
    written = json.loads((tmp_path / "metrics.json").read_text())
    numbers = {k: v for k, v in metrics.items() if isinstance(v, float)}
    assert {k: written[k] for k in numbers} == pytest.approx(numbers)
    for key in ("test/hamming_acc", "test/subset_acc", "test/example_f1", "test/micro_f1", "test/macro_f1"):
        assert 0.0 <= written[key] <= 1.0, key
    assert written["train_seconds"] > 0 and written["test_seconds"] > 0
    assert written["model"] == cfg.model.name and written["data"] == "synthetic"
    # a real (if short) training run: clearly better than predicting each label's majority value (0.746 here;
    # measured 0.882 - 0.896), which a run that trains nothing or ignores x does not beat
    dm = build_datamodule(cfg.data)
    dm.setup()
    y = dm.test_tensors[1].float()
    majority = torch.maximum(y.mean(0), 1 - y.mean(0)).mean().item()
    assert written["test/hamming_acc"] >= majority + 0.1, (written["test/hamming_acc"], majority)
    if cfg.logger == "csv":
        assert list(tmp_path.glob(f"{run_name}/**/metrics.csv"))
    assert set(written["per_label"]) == {f"y{i}" for i in range(5)}
    assert written["structure"]["num_edges"] == (0 if cfg.model.name == "independent" else 4)



@pytest.mark.parametrize("model", ["mam", "rta"])
def test_a_data_seed_other_than_the_models_runs_and_both_are_logged(model, tmp_path):
    """data.seed (the split) and model.seed (the random trees) are separate settings. Lightning merges the model's
    and the data's hyper-parameters for the logger and refuses a key held by both with different values, so
    data.seed=1 crashed every learner with a seed (RTA, MAM, CRANK) before training."""
    run(small_cfg(f"model={model}", "data.seed=1", "trainer.max_epochs=1"), tmp_path)
    hparams = OmegaConf.load(tmp_path / f"{model}-synthetic" / "hparams.yaml")
    assert hparams.seed == 0 and hparams.data.seed == 1


def test_a_grid_run_summarises_its_pixels_in_metrics_json(tmp_path):
    """Per-label entries would be one per pixel (10000 at 100x100): a grid learner writes a summary instead."""
    cfg = compose_cfg(["model=logistic", *GRID_SMALL, "trainer.max_epochs=2", "logger=none"])
    run(cfg, tmp_path)
    per_pixel = json.loads((tmp_path / "metrics.json").read_text())["per_label"]
    assert per_pixel["pixels"] == 30 and set(per_pixel) == {"pixels", "accuracy", "f1"}
    acc = per_pixel["accuracy"]
    assert 0.0 <= acc["min"] <= acc["mean"] <= acc["max"] <= 1.0

def _tensorboard_tags(logdir: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for events in logdir.glob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events), size_guidance={"images": 0, "scalars": 0})
        acc.Reload()
        tags |= set(acc.Tags()["images"]) | set(acc.Tags()["scalars"])
    return tags


def test_fused_run_trains_the_same_model(tmp_path, monkeypatch):
    """``fused=true`` (the fused C++ tree kernels) trains a tree CRF to the eager run's test metrics, inside the
    run only: its tree passes ran fused, and the caller's backend is back afterwards."""
    from structtorch import inference
    from structtorch.inference import tree

    ran_fused = []
    monkeypatch.setattr(tree, "fused_active", lambda t: ran_fused.append(inference.fused_active(t)) or ran_fused[-1])
    overrides = ["model=fixed_tree", "model.loss=crf", "logger=none", "trainer.max_epochs=5"]
    eager = run(small_cfg(*overrides, "fused=false"), tmp_path / "eager")
    assert ran_fused and not any(ran_fused)
    ran_fused.clear()
    fast = run(small_cfg(*overrides, "fused=true"), tmp_path / "fused")
    assert ran_fused and all(ran_fused)
    assert inference.current_backend() == "eager"
    for key in ("test/hamming_acc", "test/subset_acc", "test/example_f1"):
        assert fast[key] == pytest.approx(eager[key], abs=1e-6), key


def test_fused_auto_runs_the_kernels_on_cpu_and_falls_back_with_one_warning(tmp_path, monkeypatch, caplog):
    """The default ``fused=auto``: a CPU run takes the fused kernels where they build, a GPU run the eager passes
    (its tensors are CUDA), and where the build fails the run goes on eagerly after one warning."""
    from structtorch.inference import fused

    assert compose_cfg([]).fused == "auto"
    if fused.built():  # CI builds them for the fused tests; elsewhere building would take minutes
        assert run_backend(small_cfg("trainer=cpu")) == "fused"
    assert run_backend(small_cfg("trainer=gpu")) == "eager"
    assert run_backend(small_cfg("trainer=cpu", "fused=false")) == "eager"
    monkeypatch.setattr(fused, "built", lambda: False)
    monkeypatch.setattr(fused, "kernels", lambda: (_ for _ in ()).throw(RuntimeError("no compiler")))
    with caplog.at_level("INFO", logger="structtorch.train"):
        assert run_backend(small_cfg("trainer=cpu")) == "eager"
    said = [r.getMessage() for r in caplog.records]
    assert any("building the fused CPU kernels" in m for m in said)
    assert [r.levelname for r in caplog.records if "no compiler" in r.getMessage()] == ["WARNING"]
    with pytest.raises(UserError, match="fused must be auto, true or false"):
        run_backend(small_cfg("fused=sometimes"))


def test_run_without_test_writes_only_timing(tmp_path):
    metrics = run(small_cfg("test=false", "trainer.max_epochs=1"), tmp_path)
    assert "train_seconds" in metrics and not any(k.startswith("test") for k in metrics)
    assert json.loads((tmp_path / "metrics.json").read_text())["model"] == "independent"


# ---------------------------------------------------------------------- (c) checkpoint-resume
class StopAfter(L.Callback):
    """Simulates an interruption: stop once ``epochs`` epochs are done (max_epochs stays as configured)."""

    def __init__(self, epochs: int) -> None:
        self.epochs = epochs

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.current_epoch + 1 >= self.epochs:
            trainer.should_stop = True


def fresh(cfg: DictConfig):
    L.seed_everything(cfg.seed, verbose=False)
    dm = build_datamodule(cfg.data)
    return dm, build_learner(cfg.model, dm)


def trainer_for(cfg: DictConfig, max_epochs: int, callbacks=()) -> L.Trainer:
    kwargs = OmegaConf.to_container(cfg.trainer)
    kwargs.pop("num_threads"), kwargs.pop("time_budget")
    kwargs.update(max_epochs=max_epochs, enable_checkpointing=bool(callbacks), enable_progress_bar=False)
    return L.Trainer(**kwargs, logger=False, callbacks=list(callbacks))


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.energy.state_dict().items()}


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=1e-6, atol=1e-7), (k, (a[k] - b[k]).abs().max())


@pytest.mark.parametrize("model", ["independent", "fixed_tree"])
def test_resume_after_interruption_gives_the_uninterrupted_weights(model, tmp_path):
    cfg = small_cfg(f"model={model}", "trainer.max_epochs=4", "model.solver=adam")  # Adam + cosine schedule
    dm, m = fresh(cfg)
    trainer_for(cfg, 4).fit(m, datamodule=dm)
    uninterrupted = weights(m)

    dm, m = fresh(cfg)
    first = trainer_for(cfg, 4, [ModelCheckpoint(dirpath=tmp_path / "a", save_last=True), StopAfter(2)])
    first.fit(m, datamodule=dm)
    assert first.current_epoch == 2
    with pytest.raises(AssertionError):  # the interrupted run really is different
        assert_same_weights(weights(m), uninterrupted)

    dm, m = fresh(cfg)
    second = trainer_for(cfg, 4, [ModelCheckpoint(dirpath=tmp_path / "b", save_last=True)])
    second.fit(m, datamodule=dm, ckpt_path=tmp_path / "a" / "last.ckpt")
    assert second.current_epoch == 4
    assert_same_weights(weights(m), uninterrupted)


def test_resume_extending_max_epochs_gives_the_uninterrupted_weights(tmp_path):
    """Train 2 epochs, then resume the checkpoint to 4 (constant learning rate)."""
    cfg = small_cfg("model=fixed_tree", "model.lr_schedule=none", "model.solver=adam")
    dm, m = fresh(cfg)
    trainer_for(cfg, 4).fit(m, datamodule=dm)
    uninterrupted = weights(m)

    dm, m = fresh(cfg)
    trainer_for(cfg, 2, [ModelCheckpoint(dirpath=tmp_path / "a", save_last=True)]).fit(m, datamodule=dm)
    dm, m = fresh(cfg)
    trainer_for(cfg, 4, [ModelCheckpoint(dirpath=tmp_path / "b", save_last=True)]).fit(
        m, datamodule=dm, ckpt_path=tmp_path / "a" / "last.ckpt")
    assert_same_weights(weights(m), uninterrupted)


def test_resume_extending_max_epochs_keeps_annealing_the_cosine_schedule(tmp_path):
    cfg = small_cfg("model=independent", "model.solver=adam")
    dm, m = fresh(cfg)
    trainer_for(cfg, 2, [ModelCheckpoint(dirpath=tmp_path / "a", save_last=True)]).fit(m, datamodule=dm)
    dm, m = fresh(cfg)
    second = trainer_for(cfg, 4, [ModelCheckpoint(dirpath=tmp_path / "b", save_last=True)])
    second.fit(m, datamodule=dm, ckpt_path=tmp_path / "a" / "last.ckpt")
    assert second.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-9)


def test_run_resumes_from_cfg_ckpt_path(tmp_path):
    """run() with ckpt_path continues a 2-epoch run to 4 epochs: same test metrics as 4 epochs straight."""
    base = ["model=fixed_tree", "model.lr_schedule=none", "model.solver=adam", "trainer.enable_checkpointing=true"]
    straight = run(small_cfg(*base, "trainer.max_epochs=4"), tmp_path / "straight")
    run(small_cfg(*base, "trainer.max_epochs=2"), tmp_path / "first")
    last = tmp_path / "first" / "checkpoints" / "last.ckpt"
    assert last.is_file() and len(list((tmp_path / "first" / "checkpoints").glob("epoch*.ckpt"))) == 1
    resumed = run(small_cfg(*base, "trainer.max_epochs=4", f"ckpt_path='{last}'"), tmp_path / "resumed")
    tests = [k for k in straight if k.startswith("test/")]
    assert tests and {k: resumed[k] for k in tests} == {k: straight[k] for k in tests}


# ---------------------------------------------------------------------- (d) the real CLI
def cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "structtorch.train", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


CLI_TRAINER = ["trainer.max_epochs=1", "trainer.enable_progress_bar=false", "trainer.enable_checkpointing=false"]
CLI_SMALL = ["data.num_train=200", "data.num_test=100", *CLI_TRAINER]


def test_cli_single_run(tmp_path):
    out = tmp_path / "run"
    proc = cli(*CLI_SMALL, f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["model"] == "independent" and metrics["data"] == "synthetic"
    assert 0 <= metrics["test/hamming_acc"] <= 1 and metrics["train_seconds"] > 0
    assert "test/hamming_acc" in proc.stdout  # the printed summary
    saved = OmegaConf.load(out / ".hydra" / "config.yaml")
    assert saved.trainer.max_epochs == 1 and saved.data.num_train == 200


def test_cli_multirun_with_the_basic_launcher(tmp_path):
    sweep = tmp_path / "sweep"
    proc = cli("-m", "model=independent,fixed_tree", *CLI_SMALL, f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [r["status"] for r in csv.DictReader(open(sweep / "summary.csv"))] == ["ok", "ok"]
    jobs = sorted(p.parent for p in sweep.glob("*/metrics.json"))
    assert [j.name for j in jobs] == ["0", "1"]
    models = sorted(json.loads((j / "metrics.json").read_text())["model"] for j in jobs)
    assert models == ["fixed_tree", "independent"]
    assert (sweep / "multirun.yaml").is_file()


def assert_user_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit code 2, the message, and no traceback."""
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    for needle in needles:
        assert needle in output, (needle, output[-3000:])


def test_cli_missing_mulan_dataset_names_the_path(tmp_path):
    proc = cli("data=mulan", "data.name=nope", f"data.root={tmp_path}", *CLI_TRAINER,
               f"hydra.run.dir={tmp_path / 'run'}")
    assert_user_error(proc, str(tmp_path / "nope" / "nope-train.arff"))
    assert not (tmp_path / "run" / "metrics.json").exists()
    assert "nope-train.arff" in (tmp_path / "run" / "error.txt").read_text()


@pytest.mark.parametrize("args,needle", [
    (["data=mulan"], "data=mulan needs data.name"),
    (["data=mulan", "data.name=emotinos"], "emotions"),  # a typo: the message suggests the close name
    (["model.solver=adamm"], "solver"),
    (["model.l2=abc"], "l2"),  # a value of the wrong type: Hydra's message, exit code 2
])
def test_cli_user_errors_exit_2_with_one_line(args, needle, tmp_path):
    assert_user_error(cli(*args, *CLI_TRAINER, f"hydra.run.dir={tmp_path / 'run'}"), needle)


def test_cli_max_epochs_0_warns_that_the_model_is_untrained(tmp_path):
    proc = cli(*CLI_SMALL[:2], "trainer.max_epochs=0", "trainer.enable_progress_bar=false",
               f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "untrained model" in proc.stdout + proc.stderr


CKPT_RUN = ["model=fixed_tree", "data.num_train=200", "data.num_test=100", "trainer.enable_progress_bar=false"]


#: the tests of ``trained_run`` run on one xdist worker (``--dist loadgroup``), in file order: its run trains once
TRAINED_RUN_GROUP = pytest.mark.xdist_group("trained_run")


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """A 1-epoch fixed_tree run with the default logger and checkpointing, under an outputs/ folder."""
    out = tmp_path_factory.mktemp("runs") / "outputs" / "first"
    proc = cli(*CKPT_RUN, "trainer.max_epochs=1", f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert str(out.resolve() / "checkpoints" / "last.ckpt") in proc.stdout  # the console names it first
    assert "== fixed_tree on synthetic ==" in proc.stdout
    log = (out / "train.log").read_text()
    assert "run directory" in log and "test/hamming_acc" in log and "Trainer.fit" in log
    return out


def _epochs_trained(run_dir: Path) -> int:
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    return int(ckpt["epoch"]) + 1


@TRAINED_RUN_GROUP
@pytest.mark.parametrize("how", ["last", "resume", "lightning_name"])
def test_cli_resume_without_quoting(how, trained_run):
    if how == "last":
        arg = "ckpt_path=last"
    elif how == "resume":
        arg = f"resume={trained_run}"
    else:  # Lightning's own file name, with '=' signs, given unquoted
        named = trained_run / "checkpoints" / "epoch=0-step=3.ckpt"
        shutil.copy(trained_run / "checkpoints" / "last.ckpt", named)
        arg = f"ckpt_path={named}"
    out = trained_run.parent / f"resumed-{how}"
    proc = cli(*CKPT_RUN, "trainer.max_epochs=2", arg, f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resuming from" in proc.stdout
    assert _epochs_trained(out) == 2  # one more epoch on top of the checkpoint's one


@TRAINED_RUN_GROUP
def test_cli_rejects_a_text_file_and_a_wrong_model_checkpoint(trained_run, tmp_path):
    text = tmp_path / "notes.ckpt"
    text.write_text("not a checkpoint\n")
    proc = cli(*CKPT_RUN, f"ckpt_path={text}", f"hydra.run.dir={tmp_path / 'a'}")
    assert_user_error(proc, "is not a checkpoint")
    proc = cli("model=independent", *CKPT_RUN[1:], f"ckpt_path={trained_run / 'checkpoints' / 'last.ckpt'}",
               f"hydra.run.dir={tmp_path / 'b'}")
    assert_user_error(proc, "holds a FixedTree model")
    proc = cli(*CKPT_RUN, f"ckpt_path={tmp_path / 'missing.ckpt'}", f"hydra.run.dir={tmp_path / 'c'}")
    assert_user_error(proc, "no such file")


def test_cli_sweep_summary_lists_failed_jobs(tmp_path):
    sweep = tmp_path / "sweep"
    proc = cli("-m", "model.solver=adam,adamm", *CLI_SMALL, f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]  # a job failed: the sweep says so
    summary = (sweep / "summary.md").read_text()
    assert "| ok |" in summary and "| failed |" in summary and "solver" in summary
    rows = list(csv.DictReader(open(sweep / "summary.csv")))
    assert [r["status"] for r in rows] == ["ok", "failed"]
    assert "sweep summary (2 jobs, 1 failed)" in proc.stdout


def test_cli_typo_fails_before_training(tmp_path):
    proc = cli("trainer.max_epoch=1", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode != 0
    assert "max_epoch" in proc.stdout + proc.stderr
    assert not (tmp_path / "run").exists()


def test_independent_and_fixed_tree_are_the_configured_models():
    assert compose_cfg(["model=independent"]).model.name == "independent"
    cfg = compose_cfg(["model=fixed_tree"])
    assert cfg.model.name == "fixed_tree" and cfg.model.tree == "chow_liu"
    assert LEARNERS["independent"] is Independent


def test_the_console_says_whether_the_run_is_certified():
    base = {"model": "independent", "data": "emotions", "test/hamming_acc": 0.8}
    certified = {"solver": "bcfw", "relative_gap": 4e-4, "converged": True, "tol": 1e-3, "epochs": 12,
                 "rounding_tolerance": rounding_tolerance(torch.float64)}
    lines = format_metrics(base | {"solver": certified}).splitlines()
    assert lines[-1].startswith("duality gap") and lines[-1].endswith("12 epochs): certified")
    below_rounding = certified | {"relative_gap": -3e-7, "tol": 1e-9}  # a gap rounding cannot tell from 0
    assert format_metrics(base | {"solver": below_rounding}).endswith(
        "certified to within rounding only (model.tol 1e-09 is below the solve's rounding tolerance 1e-06)")
    in_float32 = certified | {"relative_gap": 5e-6, "tol": 1e-5, "rounding_tolerance": rounding_tolerance(
        torch.float32)}  # a tol float64 resolves, float32 does not
    assert format_metrics(base | {"solver": in_float32}).endswith(
        "certified to within rounding only (model.tol 1e-05 is below the solve's rounding tolerance 0.00012)")
    open_grid = certified | {"relative_gap": [4e-4, 2e-2], "converged": [True, False]}
    assert "NOT certified (raise trainer.max_epochs" in format_metrics(base | {"solver": open_grid})
    searched = open_grid | {"inference": {"train": {"certified": 0.25, "mean_k": 32.0}}}
    verdict = "NOT certified (25% of the certificate's K-best searches certified"
    assert verdict in format_metrics(base | {"solver": searched})
    cccp = {"solver": "cccp", "converged": False, "epochs": 60}
    assert "stopping rule" in format_metrics(base | {"solver": cccp}) and "NOT met" in format_metrics(
        base | {"solver": cccp})
    refit = cccp | {"refit": {"rows": 19367, "relative_gap": 4e-4, "converged": True, "tol": 1e-3,
                              "after": "time share"}}
    line = format_metrics(base | {"solver": refit})
    assert "NOT met (stopped at its share of trainer.time_budget); its forest retrained on all 19367 rows: duality " \
           "gap 4.0e-04, certified" in line
    capped = refit | {"refit": refit["refit"] | {"after": "max_epochs"}}
    assert "NOT met (stopped at trainer.max_epochs); its forest" in format_metrics(base | {"solver": capped})


SOLVER_RUNS = {  # one tiny run per kind of solver, capped at 1 epoch: (overrides, the console's last line)
    "lbfgs": (["model=independent", "model.solver=lbfgs"],
              r"duality gap .*\(lbfgs, tol 0\.001, 1 epoch\): (certified|NOT certified)"),
    "dcd": (["model=independent"], r"duality gap .*\(dcd, tol 0\.001, 1 epoch\): (certified|NOT certified)"),
    "bcfw": (["model=independent", "model.solver=bcfw", "model.tol=1e-9", "model.solver_iters=1"],  # one pass
             r"duality gap .*\(bcfw, tol 1e-09, 1 epoch\): NOT certified \(raise trainer\.max_epochs.*"),
    "cccp": (["model=crank", "model.restarts=2", "model.inner_iters=5", "model.iters=3", "model.predict_iters=20"],
             r"stopping rule +NOT met \(stopped at trainer\.max_epochs\); its forest retrained on all 180 rows: "
             r"duality gap \S+, certified +\(cccp, 1 epoch\)"),
    "algorithm1": (["model=logistic", *GRID_SMALL, "model.passes=2"],
                   r"training +logistic, 1 epoch: no certificate or stopping rule \(runs trainer\.max_epochs\)"),
    "adam": (["model=independent", "model.solver=adam"],
             r"training +adam, 1 epoch: no certificate or stopping rule \(runs trainer\.max_epochs\)"),
}


@pytest.mark.parametrize("solver", sorted(SOLVER_RUNS))
def test_the_console_says_how_training_ended_for_every_solver(solver, tmp_path, caplog):
    overrides, last_line = SOLVER_RUNS[solver]
    once = ["trainer.max_epochs=1", "logger=none"]
    cfg = compose_cfg([*overrides, *once]) if solver == "algorithm1" else small_cfg(*overrides, *once)
    with caplog.at_level("INFO", logger="structtorch.train"):
        metrics = run(cfg, tmp_path)
    table = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("== "))
    assert re.fullmatch(last_line, table.splitlines()[-1]), table
    assert ("test/subset_acc" in table) == (solver != "algorithm1")  # a grid run shows per-pixel accuracy only
    assert "test/hamming_acc" in table and metrics["solver"]["epochs"] == 1


def test_the_console_shows_the_chosen_l2_and_its_cv_curve():
    cv = {"metric": "hamming_acc", "folds": 5, "l2": [0.01, 0.1, 1.0], "scores": [0.7813, 0.7907, 0.7907],
          "chosen_l2": 1.0}
    table = format_metrics({"model": "fixed_tree", "data": "emotions", "cv": cv}).splitlines()
    assert table[-1] == "chosen l2                     1   (5-fold CV hamming_acc %: 0.01: 78.13  0.1: 79.07  1: 79.07)"


def test_auto_threads_leave_the_cores_other_processes_use(tmp_path, caplog):
    """trainer.num_threads=auto (the default) counts the other runnable processes: with one spinning process per
    core it trains on one thread and says so; after the run torch has its count from before (a sweep's next run in
    the same process may take more again)."""
    cores = os.cpu_count() or 1
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    threads = torch.get_num_threads()
    torch.set_num_threads(cores)
    try:
        time.sleep(1.0)
        with caplog.at_level(logging.INFO, logger="structtorch.threads"):
            run(small_cfg("trainer.max_epochs=1", "logger=none"), tmp_path)
        assert "trainer.num_threads=auto: 1 torch thread (" in caplog.text
        assert torch.get_num_threads() == cores
    finally:
        for p in spinners:
            p.kill()
        torch.set_num_threads(threads)


@pytest.mark.parametrize("solver", ["adam", "lbfgs"])
def test_auto_threads_follow_the_load_while_training(tmp_path, monkeypatch, caplog, solver):
    """Runs started together cannot see each other at their start: the thread count is read again while training,
    between minibatches (adam: ``FollowLoad``) and inside full-batch solvers' loops (lbfgs: ``progress.tick``)."""
    from structtorch import threads as th

    readings = iter([0])  # at the start: nobody else; from then on: both cores taken
    monkeypatch.setattr(th, "other_runnable", lambda: next(readings, 2))
    monkeypatch.setattr(th.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(th, "RETUNE_S", 0.0)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with caplog.at_level(logging.INFO, logger="structtorch.threads"):
            run(small_cfg("trainer.max_epochs=2", "logger=none", f"model.solver={solver}"), tmp_path)
        assert "trainer.num_threads=auto: 2 torch threads (0 other" in caplog.text
        assert "torch threads 2 -> 1 (2 other runnable threads on 2 cores)" in caplog.text
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("value", [0, "two", 1.5])
def test_a_bad_thread_count_is_a_user_error(tmp_path, value):
    with pytest.raises(UserError, match="trainer.num_threads must be auto, null or an int >= 1"):
        run(small_cfg(f"trainer.num_threads={value}", "logger=none"), tmp_path)


@pytest.mark.parametrize("model,work", [("mst", "build_structure"), ("tree_crf", "build_structure"),
                                        ("tree_crf", "cv_scores"), ("rta", "choose_feature_map")])
def test_a_resumed_cli_run_does_not_redo_its_set_up(model, work, tmp_path, monkeypatch):
    """``resume=<run dir>`` takes the checkpoint's structure and choices before the fit (``restore_set_up``):
    Lightning restores a checkpoint only after ``setup``, so the resumed run learned its structure, its l2 (TreeCRF's
    CV) and its feature map (RTA's CV) again and then dropped them (85 s of RTA's budget on delicious). The resumed
    run does none of that work and ends with the first run's structure and choices."""
    learner = LEARNERS[model]
    calls, done = [], getattr(learner, work)
    monkeypatch.setattr(learner, work, lambda self, *a, **k: (calls.append(work), done(self, *a, **k))[1])
    overrides = [*SMALL, f"model={model}", "logger=none", "trainer.enable_checkpointing=true", "trainer.max_epochs=1"]
    first = run(compose_cfg(overrides), tmp_path / "first")
    assert calls, f"{model} did no {work} in its first run"
    calls.clear()
    resumed = run(compose_cfg([*overrides[:-1], "trainer.max_epochs=2", f"resume={tmp_path / 'first'}"]),
                  tmp_path / "resumed")
    assert calls == []
    assert resumed["structure"] == first["structure"] and resumed.get("cv") == first.get("cv")
