"""mypy's view of `planner.kernels`.

The package installs from the top-level kernels/ folder (pyproject
package-dir), a mapping mypy cannot follow when it reads the source folders:
pyproject puts this folder on mypy_path so `import planner.kernels` type-checks
against kernels/ (checked as the module `kernels`). A submodule imported as
`planner.kernels.<name>` gets a one-line stub beside this one.
"""

from kernels import *  # noqa: F403
