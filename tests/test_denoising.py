"""Domke's denoising images and the grid datamodule: shapes, the feature distributions of the paper, batches of
GridInputs, determinism, and clear errors (also for a learner / data mismatch in train.build_learner)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from structtorch import Graph
from structtorch.data import DenoisingDataModule, denoising_images
from structtorch.inputs import GridInputs
from structtorch.train import build_learner


def test_images_follow_the_paper():
    d = denoising_images(6, 30, 40, generator=torch.Generator().manual_seed(0))
    g = Graph.grid(30, 40)
    n, E = 30 * 40, g.num_edges
    assert d.unary.shape == (6, n, 2) and d.pairwise.shape == (6, E, 2) and d.y.shape == (6, n)
    assert torch.equal(d.graph.edges, g.edges)
    assert set(d.y.unique().tolist()) <= {0, 1}
    assert (d.unary[..., 1] == 1).all() and (d.pairwise[..., 1] == 1).all()  # the constant feature
    u, y = d.unary[..., 0], d.y
    assert u[y == 0].min() >= 0 and u[y == 0].max() <= 0.9 and u[y == 1].min() >= 0.1 and u[y == 1].max() <= 1
    same = y[:, g.edges[:, 0]] == y[:, g.edges[:, 1]]
    p = d.pairwise[..., 0]
    assert p[same].max() <= 0.8 and p[~same].min() >= 0.2
    assert 0.2 < float(y.float().mean()) < 0.8  # blurred noise rounded: large blobs of both labels
    assert float(same.float().mean()) > 0.9  # smooth label images
    again = denoising_images(6, 30, 40, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again.unary, d.unary) and torch.equal(again.y, d.y)


def test_datamodule_batches_carry_grid_inputs():
    dm = DenoisingDataModule(num_train=5, num_test=3, height=6, width=7, batch_size=2)
    assert dm.num_features == 2 and dm.num_labels == 42
    assert dm.learner_inputs == {"height": 6, "width": 7, "num_states": 2, "num_pair_features": 2}
    x, y, index = next(iter(dm.train_dataloader()))
    assert isinstance(x, GridInputs) and len(x) == 2
    assert x.unary.shape == (2, 42, 2) and x.pairwise.shape == (2, Graph.grid(6, 7).num_edges, 2)
    assert y.shape == (2, 42) and index.shape == (2,)
    xs, ys = dm.train_tensors
    assert torch.equal(xs.unary[index], x.unary) and torch.equal(ys[index], y)
    assert sum(len(b[1]) for b in dm.test_dataloader()) == 3
    assert x.to(torch.float64).unary.dtype == torch.float64


@pytest.mark.parametrize("kwargs,match", [({"height": 0}, "height"), ({"num_train": 0}, "num_train"),
                                          ({"blur": -1.0}, "blur"), ({"batch_size": 0}, "batch_size")])
def test_bad_data_options_are_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DenoisingDataModule(**kwargs)


def test_bad_image_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="blur"):
        denoising_images(2, 5, 5, blur=0.0)
    with pytest.raises(TypeError, match="height"):
        denoising_images(2, 5.5, 5)


def test_build_learner_rejects_a_learner_that_does_not_take_grid_images():
    dm = DenoisingDataModule(num_train=2, num_test=2, height=4, width=4)
    with pytest.raises(ValueError, match="use a grid learner"):
        build_learner(OmegaConf.create({"name": "independent"}), dm)
    model = build_learner(OmegaConf.create({"name": "logistic", "unary": "mlp"}), dm)
    assert model.hparams.height == 4 and model.graph.num_nodes == 16
