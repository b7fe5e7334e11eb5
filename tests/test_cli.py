"""The command a user types, as they see it: ``python -m structtorch.train ...`` in a subprocess, from a directory
that is not the repository, with the default logger. Each test asserts the one line the user reads and the exit
code (issue 31: offline data, a GPU trainer without a GPU, resuming, progress, the console summary, typos,
Ctrl-C, warnings)."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
TINY = ["data.num_train=100", "data.num_test=50", "data.num_labels=4", "trainer.max_epochs=1"]


def user_cli(cwd: Path, *args: str, env: dict[str, str] | None = None,
             timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m structtorch.train <args>`` run from ``cwd`` with this checkout's package; ``stdout`` holds what
    the terminal shows (stdout and stderr interleaved)."""
    environ = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    environ.pop("HYDRA_FULL_ERROR", None)  # a shell that set it (scripts/cuda_checks.sh) gets Hydra's whole trace
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "structtorch.train", *args], cwd=cwd, env=environ,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)


#: a user error as the run's logger prints it, on a line of its own
LOGGED_ERROR = re.compile(r"^\[[^\]]+\]\[structtorch\.train\]\[ERROR\] - (error: .*)$", flags=re.M)


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one user-error line of a run that exited with code 2 and no traceback (without the log prefix)."""
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout, proc.stdout[-3000:]
    lines = LOGGED_ERROR.findall(proc.stdout)
    assert len(lines) == 1 and proc.stdout.count("error: ") == 1, proc.stdout[-3000:]
    return lines[0]


# ---------------------------------------------------------------------- typos (item 6)
def test_help_lists_no_schemas(tmp_path):
    proc = user_cli(tmp_path, "--help")
    assert proc.returncode == 0, proc.stderr[-3000:]
    model = next(line for line in proc.stdout.splitlines() if line.startswith("model: "))
    assert "fixed_tree" in model and "_schema" not in proc.stdout


@pytest.mark.parametrize("typo,line", [
    ("model=fixd_tree", "error: unknown model 'fixd_tree'; did you mean 'fixed_tree'? (choices: crank, fixed_tree, "
                        "full, greedy, independent, logistic, mam, mst, project, rta, tree_crf)"),
    ("model.l22=0.1", "error: unknown key 'model.l22'; did you mean 'model.l2'?"),
])
def test_a_typo_gets_one_line_naming_the_closest_option_or_key(typo, line, tmp_path):
    proc = user_cli(tmp_path, typo)
    assert (proc.returncode, proc.stdout) == (2, line + "\n")
    assert not (tmp_path / "outputs").exists()


# ---------------------------------------------------------------------- offline (item 1)
def test_offline_without_a_cache_says_where_it_looked_and_how_to_work_offline(tmp_path):
    """No cache and no network (a proxy that refuses every connection): one line naming the cache folder and
    both ways to work offline, exit 2, and no empty folder left in the cache."""
    cache = tmp_path / "cache"
    cache.mkdir()
    offline = {"STRUCTTORCH_DATA": str(cache), "https_proxy": "http://127.0.0.1:9", "no_proxy": ""}
    proc = user_cli(tmp_path, "model=fixed_tree", "data=emotions", env=offline)
    line = error_line(proc)
    assert line.startswith(f"error: Mulan dataset 'emotions' is not in the data cache {cache}/mulan/emotions and "
                           f"downloading https://raw.githubusercontent.com/tsoumakas/mulan/"), line
    assert line.endswith("To work offline, set STRUCTTORCH_DATA=<folder> to a filled cache (<folder>/mulan/emotions/"
                         "...) or pass root=<dir> (data.root=<dir>) holding <dir>/emotions/emotions-train.arff, "
                         "emotions-test.arff, emotions.xml"), line
    assert list(cache.iterdir()) == []


# ---------------------------------------------------------------------- trainer=gpu without a GPU (item 2)
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU: trainer=gpu runs")
def test_gpu_trainer_without_a_gpu_says_use_the_cpu_trainer(tmp_path):
    line = error_line(user_cli(tmp_path, "trainer=gpu", *TINY))
    assert line == (f"error: trainer.accelerator=gpu, but torch {torch.__version__} finds no CUDA GPU on this machine "
                    f"(torch.cuda.is_available() is False): use trainer=cpu")


# ---------------------------------------------------------------------- the console summary (items 5, 8)
NOISE = ("LeafSpec", "litlogger", "log_every_n_steps", "Traceback")


def test_a_cv_grid_run_prints_the_chosen_l2_and_its_curve_and_no_library_noise(tmp_path):
    proc = user_cli(tmp_path, "model=fixed_tree", "model.l2=[0.01,0.1,1]", *TINY)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert re.search(r"^chosen l2 +(0\.01|0\.1|1)   \(5-fold CV hamming_acc %: 0\.01: \d+\.\d\d  0\.1: \d+\.\d\d  "
                     r"1: \d+\.\d\d\)$", proc.stdout, flags=re.M), proc.stdout[-3000:]
    assert re.search(r"^duality gap .*\(lbfgs, tol 0\.001, 1 epoch\): (certified|NOT certified .*)$", proc.stdout,
                     flags=re.M), proc.stdout[-3000:]
    assert not [word for word in NOISE if word in proc.stdout], proc.stdout[-3000:]


def test_a_denoising_run_prints_per_pixel_accuracy_not_subset_accuracy(tmp_path):
    proc = user_cli(tmp_path, "model=logistic", "data=denoising", "data.num_train=2", "data.num_test=2",
                    "data.height=5", "data.width=6", "model.passes=2", "trainer.max_epochs=1")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert re.search(r"^test/hamming_acc +\d+\.\d\d %$", proc.stdout, flags=re.M), proc.stdout[-3000:]
    assert "test/subset_acc" not in proc.stdout and "test/example_f1" not in proc.stdout


# ---------------------------------------------------------------------- Ctrl-C (item 8)
def default_ctrl_c() -> None:
    """Popen's preexec_fn: the run gets SIGINT's default handler even where this test process ignores SIGINT (a
    test suite started in the background by a non-interactive shell, whose children inherit SIG_IGN: Python then
    leaves Ctrl-C ignored, and the run would never see it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def communicate_or_dump_stacks(proc: subprocess.Popen, timeout: float) -> str:
    """The output of ``proc`` once it ends; if it has not ended after ``timeout`` s, fail with the Python stacks of
    its threads (``kill -USR1``, registered by the CLI) and its last output."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(2)
        proc.kill()
        pytest.fail(f"the run did not end {timeout:.0f} s after Ctrl-C; its threads and output:\n"
                    f"{proc.communicate()[0][-6000:]}")


def test_ctrl_c_ends_with_the_command_that_resumes_the_run(tmp_path):
    args = ["model.solver=adam", "data.num_train=100", "data.num_test=50", "trainer.max_epochs=100000"]
    environ = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.Popen([sys.executable, "-m", "structtorch.train", *args], cwd=tmp_path, env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=default_ctrl_c)
    deadline = time.monotonic() + 300
    while not list(tmp_path.glob("outputs/*/*/checkpoints/last.ckpt")) and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)  # Ctrl-C, once an epoch has been checkpointed
    output = communicate_or_dump_stacks(proc, 300)
    run_dir = next(tmp_path.glob("outputs/*/*")).resolve()
    hints = re.findall(r"^\[[^\]]+\]\[structtorch\.train\]\[WARNING\] - (interrupted.*)$", output, flags=re.M)
    assert hints == [f"interrupted; resume with: python -m structtorch.train {' '.join(args)} resume={run_dir}"], \
        output[-3000:]
    assert proc.returncode == 1 and "Traceback" not in output


def test_ctrl_c_inside_a_long_epoch_writes_a_checkpoint_to_resume_from(tmp_path):
    """Issue 32 (long runs resumable): Ctrl-C in the middle of Full's first L-BFGS epoch (up to 200 iterations)
    saves checkpoints/last.ckpt with the weights and solver state so far, and the hint resumes from it."""
    # an epoch of about 27 s alone on 2 cores (8 labels and 3,000 rows certified in 2.8 s, before the Ctrl-C)
    args = ["model=full", "data.num_labels=12", "data.num_train=10000", "trainer.max_epochs=5",
            "trainer.enable_progress_bar=false"]
    environ = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.Popen([sys.executable, "-m", "structtorch.train", *args], cwd=tmp_path, env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=default_ctrl_c)
    seen = []
    for line in proc.stdout:  # the first epoch has started: wait a little inside it, then Ctrl-C
        seen.append(line)
        if "Full (lbfgs), epoch 1: started" in line:
            time.sleep(3)
            proc.send_signal(signal.SIGINT)
            break
    output = "".join(seen) + communicate_or_dump_stacks(proc, 300)
    run_dir = next(tmp_path.glob("outputs/*/*")).resolve()
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["structtorch"]["learner"] == "Full" and checkpoint["structtorch"]["solver"]["kind"] == "lbfgs"
    assert checkpoint["state_dict"]["energy.edge_weight"].abs().sum() > 0  # the interrupted epoch's weights
    assert f"interrupted; resume with: python -m structtorch.train {' '.join(args)} resume={run_dir}" in output, \
        output[-3000:]


def test_checkpoints_are_written_to_disk_not_built_in_memory(tmp_path):
    """FileCheckpointIO (the run's checkpoint writer) saves through a partial file renamed over the target, never
    holding the serialised checkpoint in Python memory (Lightning's TorchCheckpointIO builds it in a BytesIO and
    copies it once more: at least twice the checkpoint, 2 x 2 GB for RTA's dual state at bookmarks' shape); a
    last.ckpt link is replaced itself, the checkpoint it pointed to stays as it was."""
    import tracemalloc

    from lightning.fabric.plugins import TorchCheckpointIO

    from structtorch.train import FileCheckpointIO

    checkpoint = {"state": torch.arange(2**22, dtype=torch.float64)}  # 32 MiB
    peaks = {}
    for io in (TorchCheckpointIO(), FileCheckpointIO()):
        path = tmp_path / type(io).__name__ / "c.ckpt"
        tracemalloc.start()
        io.save_checkpoint(checkpoint, path)
        peaks[type(io).__name__] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert torch.equal(torch.load(path)["state"], checkpoint["state"])
    assert peaks["FileCheckpointIO"] < 2**22 < 2**25 <= peaks["TorchCheckpointIO"], peaks
    folder = tmp_path / "FileCheckpointIO"
    (folder / "last.ckpt").symlink_to("c.ckpt")
    FileCheckpointIO().save_checkpoint({"state": torch.zeros(3)}, folder / "last.ckpt")
    assert not (folder / "last.ckpt").is_symlink() and torch.load(folder / "last.ckpt")["state"].shape == (3,)
    assert torch.equal(torch.load(folder / "c.ckpt")["state"], checkpoint["state"])
    assert sorted(p.name for p in folder.iterdir()) == ["c.ckpt", "last.ckpt"]  # no partial file left


# ---------------------------------------------------------------------- ckpt_path=last (item 3)
def test_ckpt_path_last_finds_the_run_of_the_same_configuration_from_another_directory(tmp_path):
    """A run started in a/ is resumed from b/ (the run index); a run of another configuration is refused with the
    candidates and how they differ; two runs of the same configuration are refused with both listed."""
    run_args = ["model=fixed_tree", *TINY, "trainer.enable_progress_bar=false"]
    for d in ("a", "b", "c"):
        (tmp_path / d).mkdir()
    index = {"STRUCTTORCH_RUNS": str(tmp_path / "runs.jsonl")}  # this test's runs only

    def cli(where: str, *args: str) -> subprocess.CompletedProcess:
        return user_cli(tmp_path / where, *args, env=index)

    assert cli("a", *run_args).returncode == 0
    first = next((tmp_path / "a").glob("outputs/*/*")).resolve()

    resumed = cli("b", *run_args, "trainer.max_epochs=2", "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert (f"resuming from {first}/checkpoints/last.ckpt (ckpt_path=last: the one earlier run of this "
            f"configuration)") in resumed.stdout
    second = next((tmp_path / "b").glob("outputs/*/*")).resolve()

    line = error_line(cli("b", *run_args, "data.seed=1", "ckpt_path=last"))
    assert line.startswith("error: ckpt_path=last: no earlier run of this configuration (model=fixed_tree on "
                           "synthetic) has checkpoints/last.ckpt (searched the run index "), line
    assert (f"; {second} differs in data.seed=0 (this run: 1); {first} differs in data.seed=0 (this run: 1); pass "
            f"resume=<run dir> to continue a run of another configuration") in line

    assert cli("c", *run_args).returncode == 0  # the same configuration again, from scratch
    third = next((tmp_path / "c").glob("outputs/*/*")).resolve()
    line = error_line(cli("c", *run_args, "ckpt_path=last"))
    second, third = re.escape(str(second)), re.escape(str(third))
    assert re.fullmatch(rf"error: ckpt_path=last: 2 earlier runs of this configuration have a checkpoint: "
                        rf"{second} \(saved [-0-9: ]+\), {third} \(saved [-0-9: ]+\); pass resume=<run dir> to "
                        rf"choose one", line), line  # the first run is superseded by the second, which resumed it


# ---------------------------------------------------------------------- progress (item 4)
def test_structure_learning_and_the_first_epoch_say_when_they_start(tmp_path):
    proc = user_cli(tmp_path, "model=tree_crf", *TINY)
    assert proc.returncode == 0, proc.stdout[-3000:]
    started = re.findall(r"^\[[^\]]+\]\[structtorch\.progress\]\[INFO\] - (.*): started$", proc.stdout, flags=re.M)
    assert started == ["TreeCRF structure (90 training examples)",
                       "TreeCRF structure (90 training examples) > inputs of each label (l1)",
                       "TreeCRF structure (90 training examples) > edge scores (dci) of 6 label pairs",
                       "TreeCRF l2 (model.l2=auto): 3-fold CV down from 0.3",
                       "TreeCRF (lbfgs), epoch 1"], proc.stdout[-3000:]


# ---------------------------------------------------------------------- beyond one machine (the launcher)
def _installed(module: str) -> bool:
    """find_spec of a submodule raises (not None) when its parent package is missing too."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.skipif(not _installed("hydra_plugins.hydra_submitit_launcher"),
                    reason="hydra-submitit-launcher is not installed (pip install -e '.[slurm]'; the dev extra has it)")
def test_a_sweep_through_the_submitit_launcher_writes_the_summary(tmp_path):
    from structtorch.data import mulan_cache_dir
    from structtorch.data.download import uncached_mulan_files

    if uncached_mulan_files("emotions"):
        pytest.skip(f"emotions is not in the data cache {mulan_cache_dir()} (tests never download)")
    proc = user_cli(tmp_path, "-m", "hydra/launcher=submitit_local", "model=independent,fixed_tree", "data=emotions",
                    "trainer.max_epochs=1", "trainer.enable_progress_bar=false")
    assert proc.returncode == 0, proc.stdout[-3000:]
    sweep = next(tmp_path.glob("multirun/*/*"))
    assert (sweep / ".submitit").is_dir()  # the jobs went through submitit
    assert "sweep summary (2 jobs, 0 failed)" in proc.stdout
    summary = (sweep / "summary.md").read_text().splitlines()
    assert summary[0] == ("| job | overrides | status | hamming_acc % | subset_acc % | example_f1 % | train_seconds "
                          "| error |")  # the basic launcher's table
    assert [row.split(" | ")[1:3] for row in summary[2:]] == [
        ["model=independent data=emotions trainer.max_epochs=1 trainer.enable_progress_bar=False", "ok"],
        ["model=fixed_tree data=emotions trainer.max_epochs=1 trainer.enable_progress_bar=False", "ok"]]


# ---------------------------------------------------------------------- the time budget (issue 32: bounded time)
def test_the_time_budget_ends_training_and_the_console_says_not_certified(tmp_path):
    """trainer.time_budget bounds the fit: Full, which certifies in 17 s here (2 threads; 3 s at 8 labels and 2000
    rows since its lp_tol is 1e-2), stops after ~3 s of training and says so on the console and in metrics.json; a
    budget of 0 is a one-line error."""
    import json

    proc = user_cli(tmp_path, "model=full", "data.num_labels=12", "data.num_train=4000", "trainer.max_epochs=1000",
                    "trainer.time_budget=3")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert re.search(r"^duality gap .*\(lbfgs, tol 0\.001, \d+ epochs?\): NOT certified \(raise "
                     r"trainer\.time_budget to reach model\.tol\)$", proc.stdout, flags=re.M), proc.stdout[-3000:]
    metrics = json.loads(next(tmp_path.glob("outputs/*/*/metrics.json")).read_text())
    assert metrics["solver"]["stopped_by"] == "time_budget" and not metrics["solver"]["converged"]
    line = error_line(user_cli(tmp_path, "trainer.time_budget=0", *TINY))
    assert line.startswith("error: trainer.time_budget must be null or a number of seconds > 0, got 0"), line
