"""When a Triton kernel can run: on CUDA tensors (and page-locked CPU tensors,
which the GPU reaches through unified addressing), or on CPU tensors under
Triton's interpreter (``TRITON_INTERPRET=1``, read when a kernel module is
first imported)."""

from __future__ import annotations

import importlib.util
import os

import torch


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in {"1", "true", "on", "yes"}


def can_run(*tensors: torch.Tensor) -> bool:
    """Whether a Triton kernel can read and write all of ``tensors``."""
    if not triton_installed():
        return False
    if interpreting():
        return all(t.device.type == "cpu" for t in tensors)
    if not torch.cuda.is_available():
        return False
    return any(t.device.type == "cuda" for t in tensors) and all(
        t.device.type == "cuda" or t.is_pinned() for t in tensors
    )
