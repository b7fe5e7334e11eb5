"""Hydra entry point: ``python -m structtorch.train model=<name> data=<name> trainer=<cpu|gpu|ddp>``.

Trains a learner, tests it, prints the test metrics and writes ``metrics.json`` (test metrics in
[0, 1], the last validation metrics, train / test seconds) into the Hydra run directory. TensorBoard logs go there too.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import hydra
import lightning as L
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from .config import register_configs
from .data import MultilabelDataModule, SyntheticDataModule
from .graph import Graph
from .learners import LEARNERS, StructuredLearner
from .structure.edge_scores import chow_liu_tree

register_configs()


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
    raise ValueError(f"data.kind must be 'mulan' or 'synthetic', got {kind!r}")


def _tree_edges(tree: str, dm: L.LightningDataModule) -> list[list[int]]:
    n = dm.num_labels
    graphs = {"chain": Graph.chain, "star": Graph.star, "empty": Graph.empty}
    if tree == "chow_liu":
        return chow_liu_tree(dm.train_tensors[1]).edges.tolist()
    if tree not in graphs:
        raise ValueError(f"model.tree must be 'chow_liu', 'chain', 'star' or 'empty', got {tree!r}")
    return graphs[tree](n).edges.tolist()


def build_learner(model_cfg: DictConfig, dm: L.LightningDataModule) -> StructuredLearner:
    """The learner of a model config, sized by the datamodule (structure from its training labels)."""
    kwargs = OmegaConf.to_container(model_cfg, resolve=True)
    name = kwargs.pop("name")
    if name not in LEARNERS:
        raise ValueError(f"model.name must be one of {sorted(LEARNERS)}, got {name!r}")
    if "tree" in kwargs:
        kwargs["edges"] = _tree_edges(kwargs.pop("tree"), dm)
    return LEARNERS[name](num_features=dm.num_features, num_labels=dm.num_labels, **kwargs)


def _logger(kind: str, out: Path):
    if kind == "tensorboard":
        return L.pytorch.loggers.TensorBoardLogger(save_dir=str(out), name="tb", version="")
    if kind == "csv":
        return L.pytorch.loggers.CSVLogger(save_dir=str(out), name="csv", version="")
    if kind == "none":
        return False
    raise ValueError(f"logger must be 'tensorboard', 'csv' or 'none', got {kind!r}")


def run(cfg: DictConfig, out_dir: str | Path) -> dict[str, Any]:
    """Train + test as configured; returns the metrics also written to ``out_dir/metrics.json``."""
    out = Path(out_dir)
    L.seed_everything(cfg.seed, workers=True)
    dm = build_datamodule(cfg.data, world_size(cfg.trainer))
    model = build_learner(cfg.model, dm)
    trainer = L.Trainer(**OmegaConf.to_container(cfg.trainer, resolve=True), logger=_logger(cfg.logger, out),
                        default_root_dir=str(out))
    t0 = time.perf_counter()
    trainer.fit(model, datamodule=dm, ckpt_path=cfg.ckpt_path)
    metrics: dict[str, Any] = {"train_seconds": time.perf_counter() - t0}
    metrics.update({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")})
    if cfg.test:
        t0 = time.perf_counter()
        results = trainer.test(model, datamodule=dm, verbose=False)
        metrics["test_seconds"] = time.perf_counter() - t0
        metrics.update({k: float(v) for k, v in results[0].items()})
    if trainer.is_global_zero:
        metrics.update({"model": cfg.model.name, "data": cfg.data.get("name", cfg.data.kind)})
        (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
        print(format_metrics(metrics))
    return metrics


def format_metrics(metrics: dict[str, Any]) -> str:
    rows = [f"{k:<22} {v * 100:7.2f} %" for k, v in sorted(metrics.items()) if k.startswith("test/")]
    rows += [f"{k:<22} {v:8.2f} s" for k, v in sorted(metrics.items()) if k.endswith("_seconds")]
    return "\n".join([f"== {metrics.get('model')} on {metrics.get('data')} ==", *rows])


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    metrics = run(cfg, HydraConfig.get().runtime.output_dir)
    return metrics.get("test/hamming_acc")


if __name__ == "__main__":
    main()
