"""The command a user types, as they see it: ``python -m structtorch.train ...`` in a subprocess, from a directory
that is not the repository, with the default logger. Each test asserts the one line the user reads and the exit
code (issue 31: offline data, a GPU trainer without a GPU, resuming, progress, the console summary, typos,
Ctrl-C, warnings)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY = ["data.num_train=100", "data.num_test=50", "data.num_labels=4", "trainer.max_epochs=1"]


def user_cli(cwd: Path, *args: str, env: dict[str, str] | None = None,
             timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m structtorch.train <args>`` run from ``cwd`` with this checkout's package."""
    environ = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "structtorch.train", *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=timeout)


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The user-error line (``error: ...``) of a run that exited with code 2 and no traceback."""
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    lines = [line for line in output.splitlines() if "error: " in line]
    assert len(lines) == 1, output[-3000:]
    return lines[0][lines[0].index("error: "):]


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
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", line + "\n")
    assert not (tmp_path / "outputs").exists()
