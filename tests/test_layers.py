"""The layering of docs/design.md beyond what ``make lint`` (import-linter) checks: importing the engine loads
no Lightning / torchmetrics / Hydra, and no module of the package imports another module's private names."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(path: Path) -> list[str]:
    """The private names (and private modules) that ``path`` imports from structtorch."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("structtorch")):
            parts = (node.module or "").split(".")
            found += [p for p in parts if is_private(p)] + [a.name for a in node.names if is_private(a.name)]
        elif isinstance(node, ast.Import):
            found += [p for a in node.names if a.name.startswith("structtorch") for p in a.name.split(".")
                      if is_private(p)]
    return found


def test_engine_loads_no_lightning_torchmetrics_or_hydra():
    code = ("import structtorch.structure, structtorch.inference, sys; "
            "assert not any(m.split('.')[0] in ('lightning', 'torchmetrics', 'hydra') for m in sys.modules), "
            "sorted({m.split('.')[0] for m in sys.modules} & {'lightning', 'torchmetrics', 'hydra'})")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_no_module_imports_private_names_of_another():
    found = {(str(path.relative_to(REPO)), name) for path in sorted((REPO / "structtorch").rglob("*.py"))
             for name in private_imports(path)}
    assert found == set()
