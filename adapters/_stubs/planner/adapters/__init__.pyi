"""mypy's view of `planner.adapters`.

The package installs from the top-level adapters/ folder (pyproject
package-dir), a mapping mypy cannot follow when it reads the source folders:
pyproject puts this folder on mypy_path so `import planner.adapters...`
type-checks against adapters/ (checked as the module `adapters`). A submodule
imported as `planner.adapters.<path>` gets a one-line stub here.
"""

from adapters import *  # noqa: F403
