"""Hydra entry point: ``python -m structtorch.train model=<name> data=<name> trainer=<cpu|gpu|ddp>``.

Trains a learner, tests it, and writes into the Hydra run directory: ``metrics.json`` (test metrics in
[0, 1], the last validation metrics, train / test seconds, the learned structure by label name, per-label
test metrics), ``structure.png`` / ``per_label.png`` (grid learners also ``predictions.png``), checkpoints
(``checkpoints/last.ckpt``), TensorBoard logs (one run per model/data) and ``train.log``. Resume with
``ckpt_path=<file>``, ``ckpt_path=last`` (the one earlier run of the same configuration, wherever it was started:
``structtorch.runs``) or ``resume=<run dir>``.

User errors (missing data, bad config values, a typo in an option or key, a trainer this machine cannot run, a
file that is not a checkpoint of this model) end with one line (``error: ...``) and exit code 2; in a ``-m`` sweep
a failed job is recorded and the sweep goes on (see ``structtorch.sweep``).
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import re
import shlex
import signal
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from fsspec.implementations.local import LocalFileSystem
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException, OverrideParseException
from hydra.types import RunMode
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.warnings import PossibleUserWarning
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from omegaconf import DictConfig, OmegaConf

from .allocator import reuse_large_blocks
from .config import describe_config_error, register_configs
from .data import (
    DenoisingDataModule,
    MultilabelDataModule,
    SegmentationDataModule,
    SyntheticDataModule,
    TreeCRFSyntheticDataModule,
)
from .data.download import DownloadError
from .graph import check_float, check_int
from .inference import backend, fused
from .learners import LEARNERS, StructuredLearner
from .plots import close_figure
from .progress import time_budget
from .runs import find_last_checkpoint, record_run
from .threads import follow_load, retune

register_configs()
log = logging.getLogger("structtorch.train")

__all__ = ["UserError", "build_datamodule", "build_learner", "main", "run", "world_size"]


class UserError(Exception):
    """A problem the user can fix (data, config values, checkpoint): reported in one line, exit code 2."""


def world_size(trainer_cfg: DictConfig) -> int:
    """Number of data-parallel processes the trainer config asks for."""
    if "ddp" not in str(trainer_cfg.strategy):
        return 1
    devices = trainer_cfg.devices
    return (devices if isinstance(devices, int) else len(devices)) * trainer_cfg.num_nodes


def build_datamodule(data_cfg: DictConfig, processes: int = 1) -> L.LightningDataModule:
    """The datamodule of a data config; ``batch_size`` is global, split across processes."""
    kwargs = OmegaConf.to_container(data_cfg, resolve=True)
    kind = kwargs.pop("kind")
    if kwargs["batch_size"] % processes:
        raise ValueError(f"data.batch_size={kwargs['batch_size']} must divide evenly across {processes} processes")
    kwargs["batch_size"] //= processes
    if kind == "mulan":
        return MultilabelDataModule(**kwargs)
    if kind == "synthetic":
        return SyntheticDataModule(**kwargs)
    if kind == "tree_crf_synthetic":
        return TreeCRFSyntheticDataModule(**kwargs)
    if kind == "denoising":
        return DenoisingDataModule(**kwargs)
    if kind == "segmentation":
        kwargs.pop("name")
        return SegmentationDataModule(**kwargs)
    raise ValueError(f"data.kind must be 'mulan', 'synthetic', 'tree_crf_synthetic', 'denoising' or 'segmentation', "
                     f"got {kind!r}")


def build_learner(model_cfg: DictConfig, dm: L.LightningDataModule) -> StructuredLearner:
    """The learner of a model config, sized by the datamodule (a learner builds its own structure in fit)."""
    kwargs = OmegaConf.to_container(model_cfg, resolve=True)
    name = kwargs.pop("name")
    if name not in LEARNERS:
        raise ValueError(f"model.name must be one of {sorted(LEARNERS)}, got {name!r}")
    num_features, num_labels = dm.num_features, dm.num_labels  # loads the data (and its label names)
    names = list(getattr(dm, "label_names", None) or []) or None
    grid_data, grid_learner = getattr(dm, "is_grid", False), LEARNERS[name].grid_inputs
    if grid_data != grid_learner:
        raise ValueError(f"model={name} takes {'grid images' if grid_learner else 'multilabel vectors x [B, D]'}, "
                         f"but the data are {'grid images' if grid_data else 'multilabel vectors'}: "
                         + ("use a grid learner (model=logistic)" if grid_data else "use grid data (data=denoising, "
                                                                            "data=horses)"))
    if grid_data:
        kwargs.update(dm.learner_inputs)  # grid size, per-edge features, states
    return LEARNERS[name](num_features=num_features, num_labels=num_labels, label_names=names, **kwargs)


def _logger(kind: str, out: Path, run_name: str):
    if kind == "tensorboard":
        return L.pytorch.loggers.TensorBoardLogger(save_dir=str(out), name=run_name, version="",
                                                   default_hp_metric=False)
    if kind == "csv":
        return L.pytorch.loggers.CSVLogger(save_dir=str(out), name=run_name, version="")
    if kind == "none":
        return False
    raise ValueError(f"logger must be 'tensorboard', 'csv' or 'none', got {kind!r}")


def _prepare(cfg: DictConfig, out: Path) -> tuple[L.LightningDataModule, StructuredLearner, str | None]:
    """Datamodule, learner and checkpoint to resume, or a UserError saying what to fix."""
    try:
        dm = build_datamodule(cfg.data, world_size(cfg.trainer))
        model = build_learner(cfg.model, dm)
        ckpt = resolve_checkpoint(cfg, out)
        if ckpt is not None:
            check_checkpoint(ckpt, model)
            model.restore_set_up(ckpt)  # its structure and choices, so that the fit's set-up does not redo them
    except (ValueError, TypeError, FileNotFoundError, DownloadError) as err:
        raise UserError(str(err)) from err
    return dm, model, ckpt


def _run_key(cfg: DictConfig) -> tuple[str, str]:
    """(model name, data name) of a run config."""
    return str(cfg.model.name), str(cfg.data.get("name") or cfg.data.kind)


def resolve_checkpoint(cfg: DictConfig, out: Path) -> str | None:
    """The checkpoint file to resume from: ``resume=<run dir>`` -> its checkpoints/last.ckpt; ``ckpt_path=last`` ->
    that of the one earlier run of the same configuration (``structtorch.runs.find_last_checkpoint``: the run index
    and the output folder); else the path itself."""
    ckpt_path, resume = cfg.ckpt_path, cfg.resume
    if resume is not None and ckpt_path is not None:
        raise ValueError("give either resume=<run dir> or ckpt_path=<file|last>, not both")
    if resume is not None:
        ckpt = Path(resume) / "checkpoints" / "last.ckpt"
        if not ckpt.is_file():
            raise FileNotFoundError(f"resume={resume}: no checkpoints/last.ckpt in that run directory (was it "
                                    f"trained with trainer.enable_checkpointing=true?)")
        return str(ckpt)
    if ckpt_path == "last":
        return find_last_checkpoint(cfg, out, _output_base(out))
    if ckpt_path is not None and not Path(ckpt_path).is_file():
        raise FileNotFoundError(f"ckpt_path={ckpt_path}: no such file")
    return ckpt_path


def _output_base(out: Path) -> Path:
    """The folder holding all runs (``outputs`` of ``outputs/<date>/<time>``), or the run's parent."""
    for parent in out.parents:
        if parent.name in ("outputs", "multirun"):
            return parent
    return out.parent


def check_checkpoint(path: str, model: StructuredLearner) -> None:
    """ValueError unless ``path`` is a Lightning checkpoint of the same learner class and sizes. Memory-mapped: the
    check reads the few entries it needs (RTA's checkpoint on delicious holds a 1.8 GB dual state, loaded again by
    ``restore_set_up`` and by Lightning)."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except Exception as err:  # pickle, zip and torch errors all mean: not a checkpoint
        raise ValueError(f"ckpt_path={path} is not a checkpoint written by structtorch.train ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''}); pass <run dir>/checkpoints/last.ckpt "
                         f"or resume=<run dir>") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise ValueError(f"ckpt_path={path} is not a Lightning checkpoint (no state_dict)")
    saved = ckpt.get("structtorch", {}).get("learner")
    if saved is not None and saved != type(model).__name__:
        raise ValueError(f"ckpt_path={path} holds a {saved} model, but model={model.hparams.get('name', '?')} "
                         f"builds a {type(model).__name__}: pass the model it was trained with")
    hp = ckpt.get("hyper_parameters", {})
    for key in ("num_features", "num_labels"):
        if key in hp and hp[key] != model.hparams[key]:
            raise ValueError(f"ckpt_path={path} was trained with {key}={hp[key]}, but the data has "
                             f"{key}={model.hparams[key]}: pass the dataset it was trained on")


def _trainer(cfg: DictConfig, out: Path, run_name: str) -> L.Trainer:
    kwargs = OmegaConf.to_container(cfg.trainer, resolve=True)
    try:
        _budget(kwargs.pop("time_budget"))  # structtorch's own (``progress.time_budget``), applied around the fit
    except ValueError as err:
        raise UserError(str(err)) from err
    kwargs.pop("num_threads")  # structtorch's own (``thread_policy``), applied around the run
    callbacks: list[L.Callback] = [ResumeHint(out), FollowLoad()]
    if kwargs.get("enable_checkpointing", True):
        callbacks.append(ModelCheckpoint(dirpath=str(out / "checkpoints"), filename="epoch{epoch:03d}-step{step}",
                                         auto_insert_metric_name=False, save_last="link"))
    if kwargs["max_epochs"] == 0:
        log.warning("trainer.max_epochs=0: the model is not trained; testing the untrained model")
    try:
        return L.Trainer(**kwargs, logger=_logger(cfg.logger, out, run_name), default_root_dir=str(out),
                         callbacks=callbacks, plugins=[FileCheckpointIO()])
    except MisconfigurationException as err:
        raise UserError(_trainer_error(str(kwargs["accelerator"]), err)) from err


def _trainer_error(accelerator: str, err: MisconfigurationException) -> str:
    """What is wrong with the trainer config Lightning rejected, and the fix."""
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        return (f"trainer.accelerator={accelerator}, but torch {torch.__version__} finds no CUDA GPU on this machine "
                f"(torch.cuda.is_available() is False): use trainer=cpu")
    return f"the trainer config is not possible here: {' '.join(str(err).split())}"


def run(cfg: DictConfig, out_dir: str | Path, record: bool = False) -> dict[str, Any]:
    """Train + test as configured; returns the metrics also written to ``out_dir/metrics.json``. The inference
    backend (``fused``) holds for this run only. ``record``: add the run to the run index that ``ckpt_path=last``
    searches (``structtorch.runs``; the CLI does for single runs). Large blocks of memory are reused once the data are
    loaded (``allocator.reuse_large_blocks``)."""
    with backend(run_backend(cfg)), thread_policy(cfg.trainer.num_threads):
        return _run(cfg, Path(out_dir), record)


@contextmanager
def thread_policy(threads: Any) -> Iterator[None]:
    """trainer.num_threads: auto (the default) follows the machine's load (``threads.follow_load``), N fixes torch's
    thread count, null keeps torch's default (one per core)."""
    if threads == "auto":
        with follow_load():
            yield
        return
    if threads is not None:
        try:
            torch.set_num_threads(check_int(threads, "trainer.num_threads", 1, expected="auto, null or an int >= 1"))
        except ValueError as err:
            raise UserError(str(err)) from None
    yield


def run_backend(cfg: DictConfig) -> str:
    """The inference backend of a run (``cfg.fused``): true -> "fused" (the kernels built now; an error where they
    cannot be), false -> "eager"; auto (the default) -> "fused" for a run on the CPU where the kernels are built or
    build (the first time one line says so: a few minutes, then cached), else "eager" (one warning where the build
    fails). CUDA tensors run the eager passes whatever is chosen."""
    choice = cfg.get("fused", "auto")
    if choice is True or choice is False:
        return "fused" if choice else "eager"
    if choice != "auto":
        raise UserError(f"fused must be auto, true or false, got {choice!r}")
    accelerator = cfg.trainer.accelerator
    if accelerator not in ("cpu", "auto") or (accelerator == "auto" and torch.cuda.is_available()):
        return "eager"
    if not fused.built():
        log.info("building the fused CPU kernels (first run only: a few minutes with the C++ compiler, then cached "
                 "in %s; fused=false skips them)", fused.build_directory())
    try:
        fused.kernels()
    except RuntimeError as err:
        log.warning("%s Running on them (fused=false silences this).", err)
        return "eager"
    return "fused"


def _run(cfg: DictConfig, out: Path, record: bool) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)  # without a logger or checkpoints nothing else creates it
    L.seed_everything(cfg.seed, workers=True)
    data_name = _run_key(cfg)[1]
    run_name = "-".join(_run_key(cfg))
    trainer = _trainer(cfg, out, run_name)  # before the data: a trainer config that cannot run fails first
    if not trainer.is_global_zero:  # one process reports progress (structtorch.progress), not each of them
        logging.getLogger("structtorch").setLevel(logging.WARNING)
    dm, model, ckpt = _prepare(cfg, out)
    reuse_large_blocks()  # after the loader: its temporaries went back to the system, not into the heap
    if trainer.is_global_zero:
        log.info("run directory: %s", out.resolve())
        if trainer.checkpoint_callback is not None:
            log.info("checkpoints: %s (resume: ckpt_path=last or resume=%s)",
                     (out / "checkpoints" / "last.ckpt").resolve(), out.resolve())
        if record and trainer.checkpoint_callback is not None:  # a run without checkpoints cannot be resumed
            record_run(out, cfg, ckpt)
        if ckpt is not None:
            found = " (ckpt_path=last: the one earlier run of this configuration)" if cfg.ckpt_path == "last" else ""
            log.info("resuming from %s%s", ckpt, found)
    if trainer.logger is not None:  # Lightning's own merge of the two refuses a data.seed other than model.seed
        trainer.logger.log_hyperparams({"data": dict(dm.hparams)})
    t0 = time.perf_counter()
    with time_budget(_budget(cfg.trainer.time_budget)):
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt)
    metrics: dict[str, Any] = {"train_seconds": time.perf_counter() - t0}
    metrics.update({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")})
    if cfg.test:
        t0 = time.perf_counter()
        results = trainer.test(model, datamodule=dm, verbose=False)
        metrics["test_seconds"] = time.perf_counter() - t0
        metrics.update({k: float(v) for k, v in results[0].items()})
    if trainer.is_global_zero:
        metrics.update({"model": cfg.model.name, "data": data_name, "structure": model.structure_summary(),
                        "solver": {**model.solver_report(), "epochs": trainer.current_epoch}})
        if model.cv_report is not None:
            metrics["cv"] = model.cv_report
        if cfg.test:
            metrics["per_label"] = model.per_label_summary()
        (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
        pictures = _save_figures(model, out, cfg.test)
        shown = None if model.console_metrics is None else [f"test/{k}" for k in model.console_metrics]
        log.info("%s", format_metrics(metrics, shown))
        log.info("metrics: %s; pictures: %s", out / "metrics.json", ", ".join(map(str, pictures)))
    return metrics


def _budget(seconds: Any) -> float | None:
    """trainer.time_budget as seconds (None: no budget); a clear error for anything but null or a number > 0."""
    if seconds is None:
        return None
    return check_float(seconds, "trainer.time_budget", 0.0, expected="null or a number of seconds > 0")


def _save_figures(model: StructuredLearner, out: Path, tested: bool) -> list[Path]:
    """Write the learner's pictures (structure, and after testing ``test_figures``) into ``out``; their paths."""
    figures = {"structure.png": model.structure_figure(), **(model.test_figures() if tested else {})}
    for name, fig in figures.items():
        fig.savefig(out / name, dpi=100)
        close_figure(fig)
    return [out / name for name in figures]


def format_metrics(metrics: dict[str, Any], shown: Sequence[str] | None = None) -> str:
    """The console table of a run: its test metrics (those in ``shown``; None: all), timings, the regularisation
    grid's choice and CV curve, and how training ended (certified or not, stopping rule met or not)."""
    tests = [k for k in sorted(metrics) if k.startswith("test/") and (shown is None or k in shown)]
    rows = [f"{k:<22} {metrics[k] * 100:7.2f} %" for k in tests]
    rows += [f"{k:<22} {v:8.2f} s" for k, v in sorted(metrics.items()) if k.endswith("_seconds")]
    cv = metrics.get("cv")
    if cv:
        curve = "  ".join(f"{l2:g}: {100 * score:.2f}" for l2, score in zip(cv["l2"], cv["scores"]))
        curve = f"{cv['metric']} %: {curve}" if curve else "no lambda certified in its share of the time budget"
        rows.append(f"{'chosen l2':<22} {cv['chosen_l2']:8g}   ({cv['folds']}-fold CV {curve})")
    solver = metrics.get("solver")
    if solver:
        rows.append(_solver_row(solver))
    return "\n".join([f"== {metrics.get('model')} on {metrics.get('data')} ==", *rows])


def _solver_row(solver: dict[str, Any]) -> str:
    """How training ended: the certificate (lbfgs, bcfw), the stopping rule (cccp), or a fixed number of epochs."""
    epochs = f"{solver['epochs']} epoch{'' if solver['epochs'] == 1 else 's'}"
    if solver.get("certificate"):  # a certified solver that ended without one (it would not fit the time budget)
        return (f"{'duality gap':<22} {'none':>8}   ({solver['solver']}, {epochs}): NOT certified "
                f"({solver['certificate']})")
    if "relative_gap" in solver:
        done = all(solver["converged"]) if isinstance(solver["converged"], list) else solver["converged"]
        verdict = "certified" if done else f"NOT certified (raise {_cap(solver)} to reach model.tol)"
        floor = solver["rounding_tolerance"]  # of the dtype the certificate was computed in
        if done and solver["tol"] < floor:  # a gap below the floor cannot be told from 0 (nor from a small negative)
            verdict = (f"certified to within rounding only (model.tol {solver['tol']:g} is below the solve's rounding "
                       f"tolerance {floor:.2g})")
        searched = solver.get("inference", {}).get("train", {}).get("certified")
        if not done and searched is not None and searched < 1:  # an ensemble's K-best searches (RTA)
            verdict = (f"NOT certified ({100 * searched:.0f}% of the certificate's K-best searches certified: the gap "
                       f"is Lemma 7's upper bound, loose where they are not; model.k_max tightens it)")
        return (f"{'duality gap':<22} {_worst(solver['relative_gap']):8.1e}   ({solver['solver']}, "
                f"tol {solver['tol']:g}, {epochs}): {verdict}")
    if "converged" in solver:
        refit = solver.get("refit")  # CRANK searched on a row subset, then retrained its forest on every row
        share = refit is not None and refit.get("after") == "time share"
        met = "met" if solver["converged"] else \
            f"NOT met (stopped at {'its share of trainer.time_budget' if share else _cap(solver)})"
        if refit:
            met += (f"; its forest retrained on all {refit['rows']} rows: duality gap {refit['relative_gap']:.1e}, "
                    f"{'certified' if refit['converged'] else 'NOT certified'}")
        return f"{'stopping rule':<22} {met}   ({solver['solver']}, {epochs})"
    return f"{'training':<22} {solver['solver']}, {epochs}: no certificate or stopping rule (runs trainer.max_epochs)"


def _cap(solver: dict[str, Any]) -> str:
    """The limit that stopped an unfinished training: the time budget or max_epochs."""
    return "trainer.time_budget" if solver.get("stopped_by") == "time_budget" else "trainer.max_epochs"


def _worst(value: float | list[float]) -> float:
    return max(value) if isinstance(value, list) else value


def _route_library_logs() -> None:
    """Send Lightning's log records and Python warnings through the root logger (console + train.log)."""
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        lg = logging.getLogger(name)
        for handler in list(lg.handlers):
            lg.removeHandler(handler)
        lg.propagate = True
    logging.captureWarnings(True)


#: warnings every run used to print that say nothing about the run, matched narrowly by message and category
LIBRARY_NOISE = (
    # Lightning calls torch's deprecated pytree API itself
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
    # the strategies log per epoch (full-batch solvers take one step per epoch), not per step
    (r"The number of training batches \(\d+\) is smaller than the logging interval", PossibleUserWarning),
)


def _quiet_library_noise() -> None:
    """Ignore ``LIBRARY_NOISE`` and Lightning's advertising tips; every other warning and log line stays."""
    for message, category in LIBRARY_NOISE:
        warnings.filterwarnings("ignore", message=message, category=category)
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_not_a_tip)


def _not_a_tip(record: logging.LogRecord) -> bool:
    """False for Lightning's "Tip: For seamless cloud ..." lines (litlogger, litmodels)."""
    return "Tip: For seamless cloud" not in record.getMessage()


class FollowLoad(L.Callback):
    """``threads.retune`` before every training batch too: minibatch strategies (adam, Domke's) have no inner loop
    that ticks (``progress.tick`` retunes inside the long ones)."""

    def on_train_batch_start(self, *args: Any) -> None:
        retune()


class FileCheckpointIO(TorchCheckpointIO):
    """Checkpoints written by ``torch.save`` straight into a temporary file beside the target, then renamed over it
    (atomic on a local file system). Lightning's own (``_atomic_save``) builds the whole file in memory first and
    copies it once more to write it: RTA's dual state at bookmarks' shape is a 2 GB checkpoint, and saving it took
    the run's peak from 6.3 to 8.3 GB. Paths on other file systems (``s3://...``) keep Lightning's."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or not isinstance(get_filesystem(path), LocalFileSystem):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        try:
            torch.save(checkpoint, partial)
            os.replace(partial, path)  # also replaces a last.ckpt link itself, not the checkpoint it points to
        finally:
            partial.unlink(missing_ok=True)


class ResumeHint(L.Callback):
    """On Ctrl-C (a KeyboardInterrupt in fit or test): a checkpoint of the interrupted fit (checkpoints/last.ckpt:
    the weights and solver state so far, so a long epoch is not lost) and one line with the command that resumes
    the run."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, KeyboardInterrupt):
            return
        if trainer.checkpoint_callback is not None and trainer.state.fn == "fit":
            trainer.save_checkpoint(self.out / "checkpoints" / "last.ckpt")
        if trainer.is_global_zero:
            log.warning("%s", resume_hint(self.out))


def resume_hint(out: Path) -> str:
    """The line after an interruption of run ``out``: the command that resumes it (this run's overrides, without
    ckpt_path / resume, plus ``resume=<out>``), or that there is no checkpoint yet."""
    if not (out / "checkpoints" / "last.ckpt").is_file():
        return "interrupted before the first checkpoint (written after each epoch): nothing to resume, run it again"
    task = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    keep = [o for o in task if o.lstrip("+~").split("=", 1)[0] not in ("ckpt_path", "resume")]
    return "interrupted; resume with: " + shlex.join(["python", "-m", "structtorch.train", *keep,
                                                      f"resume={out.resolve()}"])


_TASK_STARTED = False


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    global _TASK_STARTED
    _TASK_STARTED = True
    _route_library_logs()
    _quiet_library_noise()
    out = Path(HydraConfig.get().runtime.output_dir)
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        metrics = run(cfg, out, record=not multirun)
    except UserError as err:
        (out / "error.txt").write_text(f"{err}\n")
        log.error("error: %s", err)
        if multirun:
            return None
        sys.exit(2)
    except Exception as err:
        if not multirun:
            raise
        (out / "error.txt").write_text(f"{type(err).__name__}: {err}\n")
        log.exception("job failed")
        return None
    return metrics.get("test/hamming_acc")


_QUOTE = re.compile(r"^(ckpt_path|resume)=(?!['\"])(.*=.*)$")
#: what Hydra raises for a config it cannot compose (an unknown option or key, a bad value, an unparsable override)
CONFIG_ERRORS = (ConfigCompositionException, OverrideParseException)


def cli() -> None:
    """``python -m structtorch.train``: quotes checkpoint paths holding '=' (Lightning's
    ``epoch=59-step=360.ckpt``) for Hydra, and turns Hydra's config errors into one line and exit code 2."""
    sys.argv = [_QUOTE.sub(lambda m: f"{m.group(1)}='{m.group(2)}'", a) for a in sys.argv]
    if hasattr(signal, "SIGUSR1"):  # `kill -USR1 <pid>`: every thread's Python stack to stderr (a run that hangs)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    full_error = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises its errors here instead of printing them
    try:
        main()
    except CONFIG_ERRORS as err:
        if full_error == "1":  # the user asked for Hydra's whole trace
            raise
        print(f"error: {describe_config_error(err)}", file=sys.stderr)
        sys.exit(2)
    except SystemExit as stop:
        if stop.code == 1 and not _TASK_STARTED:  # Hydra rejected the command line before any job ran
            sys.exit(2)
        raise
    finally:
        _restore_env("HYDRA_FULL_ERROR", full_error)


def _restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


if __name__ == "__main__":
    cli()
