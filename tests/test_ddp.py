"""Data-parallel training on CPU: trainer=ddp (2 processes, gloo) against one process with the same
global batch, metrics reduced across processes by torchmetrics, how the global batch is split, and two
"nodes" of one process each started the way a cluster starts them (NODE_RANK, MASTER_ADDR, MASTER_PORT).

Every test here starts real processes (``python -m structtorch.train`` or a small script that
Lightning's DDP launcher re-executes once per rank).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from structtorch.data.datamodule import EpochShuffle, SyntheticDataModule

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_process(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               HYDRA_FULL_ERROR="1", PYTHONWARNINGS="ignore",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    for key in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "PL_GLOBAL_SEED"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


# ---------------------------------------------------------------------- DDP vs one process
# Full-batch training: the global batch (data.batch_size = all 400 training examples, no validation
# split) is literally the same set of examples in both runs, so DDP's averaged gradient equals the
# single-process one and both optimise the same trajectory.
DDP_VS_CPU = ["model=fixed_tree", "model.lr=0.1", "model.l2=0.1", "seed=0", "data.seed=0", "data.num_train=400",
              "data.val_fraction=0", "data.batch_size=400", "data.num_test=1000", "data.num_labels=5",
              "trainer.max_epochs=40", "logger=none", "trainer.enable_progress_bar=false",
              "trainer.enable_checkpointing=false"]
TEST_KEYS = ["test/hamming_acc", "test/subset_acc", "test/example_f1", "test/micro_f1", "test/macro_f1"]


@pytest.mark.parametrize("solver", ["adam", "lbfgs"])
def test_ddp_two_cpu_processes_match_one_process(solver, tmp_path):
    """adam: DDP averages the full-batch gradient; lbfgs: every rank runs the same full-batch solve."""
    results = {}
    for trainer in ("cpu", "ddp"):
        out = tmp_path / trainer
        proc = run_process(["-m", "structtorch.train", f"trainer={trainer}", *DDP_VS_CPU, f"model.solver={solver}",
                            f"hydra.run.dir={out}"])
        results[trainer] = json.loads((out / "metrics.json").read_text())
        if trainer == "ddp":
            assert "distributed_backend=gloo" in proc.stdout + proc.stderr
            assert "Starting with 2 processes" in proc.stdout + proc.stderr
    cpu, ddp = results["cpu"], results["ddp"]
    print({k: (round(cpu[k], 5), round(ddp[k], 5)) for k in TEST_KEYS})
    for key in TEST_KEYS:
        assert 0.0 <= cpu[key] <= 1.0 and 0.0 <= ddp[key] <= 1.0
        assert abs(cpu[key] - ddp[key]) <= 0.005, (key, cpu[key], ddp[key])
    # and the model learned something (5 labels: chance-level Hamming accuracy is far below this)
    assert cpu["test/hamming_acc"] > 0.85
    if solver == "lbfgs":
        assert cpu["solver"]["converged"] and ddp["solver"]["converged"]
        assert ddp["solver"]["primal"] == pytest.approx(cpu["solver"]["primal"], rel=1e-4)


# ---------------------------------------------------------------------- a DDP script: batches + metric reduction
DDP_SCRIPT = textwrap.dedent('''
    """Run by test_ddp.py; Lightning re-executes it once per rank (LOCAL_RANK set)."""
    import json
    import sys
    import warnings

    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from structtorch.data import SyntheticDataModule
    from structtorch.learners import Independent

    warnings.filterwarnings("ignore")


    class Record(L.Callback):
        def __init__(self):
            self.batches = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.batches.append([trainer.current_epoch, batch[0][:, 0].tolist()])


    class Alternating(L.LightningDataModule):
        """40 examples, 1 label, always 1; x alternates +1, -1: the fixed model below gets the even
        examples right and the odd ones wrong, and rank r of 2 is given examples r, r + 2, ..."""

        def test_dataloader(self):
            x = torch.tensor([[1.0], [-1.0]] * 20)
            return DataLoader(TensorDataset(x, torch.ones(40, 1, dtype=torch.long)), batch_size=5)


    def main():
        out = sys.argv[1]
        torch.set_num_threads(1)
        L.seed_everything(0, verbose=False)
        dm = SyntheticDataModule(num_train=96, num_test=8, num_labels=3, batch_size=16, val_fraction=0.0, seed=0)
        rec = Record()
        trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            callbacks=[rec])
        trainer.fit(Independent(dm.num_features, dm.num_labels, solver="adam"), datamodule=dm)  # 2 epochs

        model = Independent(1, 1)
        with torch.no_grad():
            model.energy.unary.weight.fill_(1.0)
            model.energy.unary.bias.fill_(0.0)
        metrics = trainer.test(model, datamodule=Alternating(), verbose=False)[0]
        with open(f"{out}/rank{trainer.global_rank}.json", "w") as f:
            json.dump({"world_size": trainer.world_size, "batches": rec.batches, "logged": metrics}, f)


    if __name__ == "__main__":
        main()
''')


#: the tests of ``ddp_script_results`` run on one xdist worker (``--dist loadgroup``): the script runs once
DDP_SCRIPT_GROUP = pytest.mark.xdist_group("ddp_script")


@pytest.fixture(scope="module")
def ddp_script_results(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("ddp_script")
    script = tmp / "ddp_script.py"
    script.write_text(DDP_SCRIPT)
    run_process([str(script), str(tmp)])
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(2)]


@DDP_SCRIPT_GROUP
def test_metrics_are_reduced_across_processes(ddp_script_results):
    """Rank 0 sees only correct examples, rank 1 only wrong ones: every rank must report the global
    value, and micro-F1 (2 tp / (2 tp + fp + fn) over pooled counts) tells sum-reduced states apart from
    an average of per-rank values (which would give (1 + 0) / 2 = 0.5)."""
    expected = {"test/hamming_acc": 0.5, "test/subset_acc": 0.5, "test/example_f1": 0.5,
                "test/micro_f1": 2 * 20 / (2 * 20 + 0 + 20), "test/macro_f1": 2 * 20 / (2 * 20 + 0 + 20)}
    for rank in ddp_script_results:
        assert rank["world_size"] == 2
        assert rank["logged"] == pytest.approx(expected, abs=1e-6)


def _train_indices(rank_batches: list[list]) -> dict[int, list[list[int]]]:
    """epoch -> list of batches, each a list of training-set indices (identified by the first feature)."""
    dm = SyntheticDataModule(num_train=96, num_test=8, num_labels=3, batch_size=16, val_fraction=0.0, seed=0)
    index = {round(v, 5): i for i, v in enumerate(dm.train_tensors[0][:, 0].tolist())}
    assert len(index) == 96
    out: dict[int, list[list[int]]] = {}
    for epoch, firsts in rank_batches:
        out.setdefault(epoch, []).append([index[round(v, 5)] for v in firsts])
    return out


@DDP_SCRIPT_GROUP
def test_ddp_splits_the_global_batch_and_covers_each_epoch(ddp_script_results):
    ranks = [_train_indices(r["batches"]) for r in ddp_script_results]
    for epoch in (0, 1):
        per_rank = [ranks[r][epoch] for r in range(2)]
        assert [len(b) for b in per_rank[0]] == [16] * 3 and [len(b) for b in per_rank[1]] == [16] * 3
        seen = sorted(i for batches in per_rank for b in batches for i in b)
        assert seen == list(range(96))  # every training example exactly once per epoch
    assert ranks[0][0] != ranks[0][1]  # reshuffled every epoch


@DDP_SCRIPT_GROUP
def test_ddp_global_batches_are_the_single_process_batches(ddp_script_results):
    ranks = [_train_indices(r["batches"]) for r in ddp_script_results]
    sampler = EpochShuffle(96, seed=0)
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        order = list(sampler)
        single = [sorted(order[k:k + 32]) for k in range(0, 96, 32)]
        union = [sorted(a + b) for a, b in zip(ranks[0][epoch], ranks[1][epoch])]
        assert union == single


def test_epoch_shuffle_is_a_function_of_seed_and_epoch():
    a, b = EpochShuffle(50, seed=3), EpochShuffle(50, seed=3)
    a.set_epoch(4)
    b.set_epoch(4)
    assert list(a) == list(b) and sorted(a) == list(range(50)) and len(a) == 50
    b.set_epoch(5)
    assert list(a) != list(b)
    assert list(EpochShuffle(50, seed=4)) != list(EpochShuffle(50, seed=3))


def test_ddp_full_keeps_every_examples_messages_on_every_rank(tmp_path):
    """Full's per-example warm starts are all-gathered: the checkpoint (written by rank 0) holds the
    messages of the examples that rank 1 trained on too."""
    import torch

    out = tmp_path / "full"
    run_process(["-m", "structtorch.train", "trainer=ddp", "model=full", "model.solver=adam", "model.iters=3",
                 "data.num_train=120",
                 "data.val_fraction=0", "data.batch_size=20", "data.num_test=20", "data.num_labels=4",
                 "trainer.max_epochs=1", "trainer.enable_progress_bar=false", f"hydra.run.dir={out}"])
    state = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    messages = state["example_state.messages"]
    assert messages.shape[0] >= 120
    written = messages[:120].flatten(1).abs().sum(1) > 0
    assert bool(written.all()), f"{int((~written).sum())} of 120 examples have no stored messages"


# ---------------------------------------------------------------------- multi-node, as on a cluster
NODES = ["model=independent", "model.solver=lbfgs", "seed=0", "data.seed=0", "data.num_train=400",
         "data.val_fraction=0", "data.batch_size=100", "data.num_test=500", "data.num_labels=5",
         "trainer.max_epochs=60", "logger=none", "trainer.enable_progress_bar=false",
         "trainer.enable_checkpointing=false"]


def test_two_nodes_of_one_process_each_give_the_certified_one_process_result(tmp_path):
    """The README's multi-node form run as two local "nodes" on gloo: the same command on each, with
    MASTER_ADDR / MASTER_PORT / NODE_RANK set (Lightning's environment for a cluster without SLURM) and
    trainer.num_nodes=2 trainer.devices=1. Both ranks run the certified full-batch L-BFGS solve, test on their
    half of the test set (metrics reduced across the nodes) and end certified with one process's objective and
    test metrics."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               PYTHONWARNINGS="ignore", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    for key in ("LOCAL_RANK", "WORLD_SIZE", "RANK", "PL_GLOBAL_SEED"):
        env.pop(key, None)
    nodes = [subprocess.Popen([sys.executable, "-m", "structtorch.train", "trainer=ddp", "trainer.num_nodes=2",
                               "trainer.devices=1", *NODES, f"hydra.run.dir={tmp_path / f'node{rank}'}"],
                              cwd=tmp_path, env=dict(env, NODE_RANK=str(rank)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    outputs = [node.communicate(timeout=600)[0] for node in nodes]
    for node, output in zip(nodes, outputs):
        assert node.returncode == 0, output[-4000:]
    assert "MEMBER: 1/2" in outputs[0] and "MEMBER: 2/2" in outputs[1] and "distributed_backend=gloo" in outputs[0]
    assert not (tmp_path / "node1" / "metrics.json").exists()  # rank 0 writes the results
    run_process(["-m", "structtorch.train", "trainer=cpu", *NODES, f"hydra.run.dir={tmp_path / 'one'}"])
    one, two = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("one", "node0"))
    assert one["solver"]["converged"] and two["solver"]["converged"]
    assert two["solver"]["primal"] == pytest.approx(one["solver"]["primal"], rel=1e-4)
    for key in TEST_KEYS:
        assert abs(one[key] - two[key]) <= 0.005, (key, one[key], two[key])
