"""mypy's view of `planner.solvers`.

The package installs from the top-level solvers/ folder (pyproject
package-dir), a mapping mypy cannot follow when it reads the source folders:
pyproject puts this folder on mypy_path so `import planner.solvers` in
planner/ type-checks against solvers/ (checked as the module `solvers`).
"""

from solvers import *  # noqa: F403
