"""The end-to-end tier: a real vLLM OpenAI server (CPU build) with a tiny
model built here, a real `planner serve`, load over HTTP. Skips where vLLM is
not installed (run `make test-e2e`)."""

from __future__ import annotations

import importlib.util
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from planner.bench.tiny_llama import cached

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
SKIP_REASON = "vLLM is not installed here (run `make test-e2e`, see docs/adapters.md)"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if HAVE_VLLM:
        return
    for item in items:
        if "tests/e2e" in str(item.path):
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


# Where the tiny model is kept between runs (a stable path lets vLLM reuse its
# torch.compile cache); the Makefile's engine cache by default.
MODEL_CACHE = Path(
    os.environ.get("PLANNER_E2E_MODEL_CACHE", Path.home() / ".cache" / "planner-engines")
)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    MODEL_CACHE.mkdir(parents=True, exist_ok=True)
    return cached(MODEL_CACHE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def port() -> Iterator[int]:
    yield free_port()
