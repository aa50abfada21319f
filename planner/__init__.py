"""planner: the policy brain for LLM serving engines."""

from planner._version import __version__

__all__ = ["__version__"]
