"""Runs import-linter (`lint-imports`, contracts in pyproject.toml) on the
package as it installs.

solvers/, kernels/ and adapters/ install as planner.solvers, planner.kernels
and planner.adapters (pyproject's package-dir), but import-linter reads a
package from one folder. This builds that folder from links in a temporary
directory (planner/'s entries, and each package-dir folder under its
installed name), puts it first on the path and runs lint-imports there with
the project's configuration.

    python tools/lint_imports.py [--root DIR]

--root: the checkout to check (default: this one). Exit status and output
are lint-imports'.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT_PACKAGE = "planner"


def link_tree(root: Path, into: Path) -> Path:
    """into/planner: links to root/planner's entries and to each folder that
    pyproject's package-dir maps to a planner subpackage."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    mapped = pyproject["tool"]["setuptools"]["package-dir"]
    package = into / ROOT_PACKAGE
    package.mkdir()
    for entry in (root / ROOT_PACKAGE).iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry.resolve())
    for name, folder in mapped.items():
        parent, _, child = name.rpartition(".")
        if parent != ROOT_PACKAGE:
            raise SystemExit(f"lint_imports: package-dir {name!r} is not under {ROOT_PACKAGE}")
        (package / child).symlink_to((root / folder).resolve())
    return package


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args(argv)
    root: Path = args.root.resolve()
    lint_imports = Path(sys.executable).parent / "lint-imports"
    with tempfile.TemporaryDirectory(prefix="lint-imports-") as tmp:
        link_tree(root, Path(tmp))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([tmp, os.environ.get("PYTHONPATH", "")]))
        done = subprocess.run(
            [str(lint_imports), str(root / "pyproject.toml"), "--no-cache"],
            cwd=tmp,
            env=env,
            check=False,
        )
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
