"""planner.kernels installs from the top-level kernels/ folder and imports
without torch (its modules need it, the package does not)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_planner_kernels_maps_to_the_kernels_folder():
    module = importlib.import_module("planner.kernels")
    assert Path(module.__file__).resolve() == REPO_ROOT / "kernels" / "__init__.py"


def test_package_import_does_not_pull_torch():
    probe = "import sys, planner.kernels; print('torch' in sys.modules, 'triton' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["False", "False"]
