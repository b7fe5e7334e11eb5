"""ExampleState: per-example tensors that are checkpointed, grow on demand and read the fill value when unseen;
Full's warm-start messages live there, so a resumed Full run equals an uninterrupted one bitwise."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from structtorch.data import SyntheticDataModule
from structtorch.learners import Full
from structtorch.state import ExampleState

pytestmark = [pytest.mark.usefixtures("quiet_single_thread"),
              pytest.mark.filterwarnings("ignore:.*does not have many workers"),
              pytest.mark.filterwarnings("ignore:.*LeafSpec"),
              pytest.mark.filterwarnings("ignore:.*log_every_n_steps")]


def test_unseen_rows_read_the_fill_value_and_written_rows_come_back():
    s = ExampleState()
    s.add("m", (2, 3), fill=-1.0)
    assert torch.equal(s.get("m", torch.tensor([0, 5])), torch.full((2, 2, 3), -1.0))
    v = torch.randn(2, 2, 3)
    s.set("m", torch.tensor([4, 1]), v)
    assert s.num_examples("m") >= 5
    got = s.get("m", torch.tensor([1, 4, 0, 9]))
    assert torch.equal(got[0], v[1]) and torch.equal(got[1], v[0])
    assert torch.equal(got[2], torch.full((2, 3), -1.0)) and torch.equal(got[3], torch.full((2, 3), -1.0))
    s.reset("m")
    assert torch.equal(s.get("m", torch.tensor([4])), torch.full((1, 2, 3), -1.0))


def test_state_dict_round_trip_resizes_a_fresh_store():
    a = ExampleState()
    a.add("m", (3,))
    a.set("m", torch.arange(7), torch.randn(7, 3))
    b = ExampleState()
    b.add("m", (3,))
    b.load_state_dict(a.state_dict())
    assert torch.equal(b.get("m", torch.arange(7)), a.get("m", torch.arange(7)))


@pytest.mark.parametrize("bad,err", [(torch.tensor([0.5]), TypeError), (torch.tensor([[1]]), TypeError),
                                     (torch.tensor([-1]), ValueError)])
def test_bad_index_is_a_clear_error(bad, err):
    s = ExampleState()
    s.add("m", (2,))
    with pytest.raises(err, match="index"):
        s.get("m", bad)


def test_bad_value_shape_and_unknown_field():
    s = ExampleState()
    s.add("m", (2,))
    with pytest.raises(ValueError, match=r"shape \[1, 2\]"):
        s.set("m", torch.tensor([0]), torch.zeros(1, 3))
    with pytest.raises(KeyError, match="no field 'x'"):
        s.get("x", torch.tensor([0]))
    with pytest.raises(ValueError, match="already exists"):
        s.add("m", (2,))


class StopAfter(L.Callback):
    def __init__(self, epochs: int) -> None:
        self.epochs = epochs

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.current_epoch + 1 >= self.epochs:
            trainer.should_stop = True


def _fit(max_epochs: int, callbacks=(), ckpt=None) -> Full:
    L.seed_everything(0, verbose=False)
    dm = SyntheticDataModule(num_train=120, num_test=20, num_labels=5, batch_size=32)
    model = Full(dm.num_features, dm.num_labels, iters=5, solver="adam")  # the warm-started Adam path
    # bit for bit on the CPU: on a CUDA GPU (an H200) the resumed run differed in its last bits
    trainer = L.Trainer(max_epochs=max_epochs, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_checkpointing=bool(callbacks), callbacks=list(callbacks), enable_model_summary=False)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt)
    return model


def test_full_resumes_bitwise_equal_to_an_uninterrupted_run(tmp_path):
    straight = _fit(4)
    _fit(4, [ModelCheckpoint(dirpath=tmp_path, save_last=True), StopAfter(2)])
    resumed = _fit(4, [ModelCheckpoint(dirpath=tmp_path / "b", save_last=True)], ckpt=tmp_path / "last.ckpt")
    assert straight.example_state.num_examples("messages") > 0
    for (k, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), k  # weights and every stored message, bit for bit
    messages = resumed.example_state.messages
    assert messages.abs().sum() > 0  # the warm starts were really stored and restored
