"""The vLLM engine tier's fixtures live in harness.py, which imports vLLM; they
are registered only where vLLM is installed. Without it every module of the
tier skips itself (tests/engines/vllm/__init__.py's SKIP_REASON), so that
`pytest tests/engines/vllm` skips cleanly as `pytest tests` does."""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("vllm") is not None:
    from .harness import (  # noqa: F401 (fixtures)
        engine,
        kv_cache_config_fixture,
        vllm_config,
    )
