"""Packaging: one import root (`planner`), no shadowing of `kernels`,
`adapters` or `solvers` (DESIGN.md §1), top-level source folders mapped under
`planner` (solvers/ -> planner.solvers), and both editable and regular
installs import."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from planner.solvers import Model, solve

import planner
from planner.v1 import rotation_pb2, rotation_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[1]
FOREIGN_NAMES = ("kernels", "adapters", "solvers")
STUBS = ("common_pb2", "info_pb2", "rotation_pb2", "rotation_pb2_grpc", "info_pb2_grpc")
# Top-level source folders installed under `planner` (pyproject package-dir).
MAPPED = {
    "solvers": "planner.solvers",
    "kernels": "planner.kernels",
    "adapters": "planner.adapters",
}


def _source_packages() -> dict[str, Path]:
    """Every package of the checkout (a folder with __init__.py under planner/
    or a mapped folder), by its installed dotted name."""
    out = {}
    roots = {"planner": "planner", **MAPPED}
    for folder, name in roots.items():
        base = REPO_ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            if "__pycache__" in rel.parts:
                continue
            out[".".join([name, *rel.parts])] = init.parent
    return out


def _from_this_repo(origin: str | None) -> bool:
    if origin is None:
        return False
    return Path(origin).resolve().is_relative_to(REPO_ROOT)


_FIND_SPECS = """
import importlib.util, json, sys
out = {}
for name in sys.argv[1:]:
    spec = importlib.util.find_spec(name)
    out[name] = None if spec is None else [spec.origin, *(spec.submodule_search_locations or [])]
print(json.dumps(out))
"""


def test_install_adds_no_foreign_top_level_module(tmp_path):
    """What the installed environment resolves, from a neutral directory (the
    test run's own cwd, the checkout, is on sys.path and would see its
    top-level source folders)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", _FIND_SPECS, *FOREIGN_NAMES, "planner", *MAPPED.values()],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
        check=True,
    )
    found = json.loads(result.stdout)
    for name in FOREIGN_NAMES:
        origins = found[name] or []
        assert not any(_from_this_repo(o) for o in origins), (name, origins)
    # The editable install itself resolves, from this checkout.
    assert any(_from_this_repo(o) for o in found["planner"])
    for folder, name in MAPPED.items():
        origin = found[name][0]
        assert Path(origin).resolve() == (REPO_ROOT / folder / "__init__.py").resolve(), name


def test_planner_and_stubs_import():
    pkg = importlib.import_module("planner")
    assert _from_this_repo(pkg.__file__)
    for stub in STUBS:
        module = importlib.import_module(f"planner.v1.{stub}")
        assert _from_this_repo(module.__file__)

    assert rotation_pb2.DESCRIPTOR.package == "planner.v1"
    assert hasattr(rotation_pb2_grpc, "RotationServiceStub")
    for folder, name in MAPPED.items():
        module = importlib.import_module(name)
        assert Path(module.__file__).resolve().parent == REPO_ROOT / folder

    assert callable(solve) and Model().num_vars == 0


def test_editable_install_maps_only_planner():
    """The installed distribution's top-level names: `planner` alone."""
    dist = metadata.distribution("planner")
    top_level = dist.read_text("top_level.txt")
    if top_level is not None:
        assert set(top_level.split()) == {"planner"}
    scripts = {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}
    assert scripts["planner"] == "planner.cli:main"


def _copy_project(dest: Path) -> Path:
    """The project as a user would check it out, without build outputs."""
    src = dest / "src"
    shutil.copytree(
        REPO_ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv*",
            ".tools",
            "__pycache__",
            "*.egg-info",
            "build",
            "dist",
            ".*_cache",
            ".hypothesis",
            "out",
            "node_modules",
        ),
    )
    return src


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = _copy_project(tmp)
    out = tmp / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "--wheel-dir",
            str(out),
            str(src),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    (whl,) = out.glob("planner-*.whl")
    return whl


def test_wheel_has_one_top_level_package(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    top = {n.split("/")[0] for n in names}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert len(dist_info) == 1
    assert top - dist_info == {"planner"}
    for stub in STUBS:
        assert f"planner/v1/{stub}.py" in names
    assert "planner/py.typed" in names
    # Every package folder of the checkout is in the wheel: pyproject lists them
    # (setuptools' find cannot map solvers/ to planner.solvers), so a new one
    # must be added to [tool.setuptools] packages.
    missing = [
        name for name in _source_packages() if name.replace(".", "/") + "/__init__.py" not in names
    ]
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"
    for folder, name in MAPPED.items():
        for source in (REPO_ROOT / folder).rglob("*.py"):
            rel = source.relative_to(REPO_ROOT / folder).as_posix()
            assert name.replace(".", "/") + "/" + rel in names, rel
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    with zipfile.ZipFile(wheel) as z:
        text = z.read(entry_points).decode()
    assert "planner = planner.cli:main" in text


def test_regular_install_imports(wheel, tmp_path):
    """Install the wheel into a target dir and import from there (not from
    the editable checkout), in a fresh interpreter."""
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--quiet",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    probe = f"""
import importlib, importlib.util, sys
import planner
assert planner.__file__.startswith({str(target)!r}), planner.__file__
from planner.v1 import common_pb2, info_pb2, rotation_pb2, rotation_pb2_grpc
import planner.cli, planner.service.server
for name in {tuple(MAPPED.values())!r}:
    module = importlib.import_module(name)
    assert module.__file__.startswith({str(target)!r}), module.__file__
from planner.solvers import Model, solve
for name in {FOREIGN_NAMES!r}:
    spec = importlib.util.find_spec(name)
    assert spec is None or not (spec.origin or "").startswith({str(target)!r}), name
print(planner.__version__)
"""
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr

    assert result.stdout.strip() == planner.__version__
    installed = {p.name for p in target.iterdir() if not p.name.endswith(".dist-info")}
    assert installed - {"bin"} == {"planner"}
