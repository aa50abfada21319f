"""`make lint`'s import contracts (pyproject.toml, tools/lint_imports.py)
hold on this tree and fail on a deliberate break in a copy of it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "lint_imports.py"
FOLDERS = ("planner", "solvers", "kernels", "adapters")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), "--root", str(root)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """The packages and the configuration, copied."""
    for folder in FOLDERS:
        shutil.copytree(
            ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_copy_keeps_every_contract(tree: Path) -> None:
    done = lint_imports(tree)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("files", "contract"),
    [
        # Inside a function: an import there is no way around the rule.
        (
            {
                "planner/domain/shortcut.py": (
                    "def engine() -> object:\n    from planner.replay import engine\n\n"
                    "    return engine\n"
                )
            },
            "Layers: domain <- policies <- replay and service <- commands and bench <- cli",
        ),
        (
            {"planner/policies/shortcut.py": "from planner.service import errors\n"},
            "Only the CLI and the benches import the service and the replay",
        ),
        (
            {"kernels/shortcut.py": "from planner.domain import requests\n"},
            "Kernels import nothing of the planner",
        ),
        (
            {"adapters/common/shortcut.py": "from planner.policies import rotation\n"},
            "Adapters use only the client, the proto, the kernels and the in-process shim",
        ),
        (
            {
                "planner/trace/ring_a.py": "from planner.trace import ring_b\n",
                "planner/trace/ring_b.py": "from planner.trace import ring_a\n",
            },
            "No import cycles between sibling modules",
        ),
    ],
)
def test_a_deliberate_bad_import_breaks_its_contract(
    tree: Path, files: dict[str, str], contract: str
) -> None:
    for path, source in files.items():
        (tree / path).write_text(source, encoding="utf-8")
    done = lint_imports(tree)
    assert done.returncode != 0
    assert f"{contract} BROKEN" in done.stdout, done.stdout + done.stderr


def test_adapters_load_the_service_only_to_run_it_in_process() -> None:
    # The in-process shim's handler table is loaded by name when a link
    # without a target is made; an engine using a planner server never
    # loads the service (nor the replay).
    code = (
        "import sys\n"
        "import planner.adapters.common.link, planner.adapters.common.offload_link\n"
        "import planner.adapters.vllm.settings\n"
        "heavy = ('planner.service', 'planner.replay')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "[]"
