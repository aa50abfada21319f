"""Kernel tests: skipped whole where torch is not installed; without a CUDA
device Triton kernels run under its interpreter (set before any kernel module
is imported), and tests marked ``gpu`` are skipped."""

from __future__ import annotations

import importlib.util
import os

import pytest

HAS_TORCH = importlib.util.find_spec("torch") is not None
if not HAS_TORCH:
    collect_ignore_glob = ["test_*.py"]
else:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_TORCH and torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
