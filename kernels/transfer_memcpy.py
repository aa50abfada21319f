"""Batched copies through ``cudaMemcpyBatchAsync`` (CUDA >= 12.8), called via
cuda-python's ``cuda.bindings.runtime``: every extent of a batch in one call,
on one stream.

The C signature changed in CUDA 13: 12.8/12.9 take a trailing ``size_t
*failIdx`` before the stream, 13.x dropped it. cuda-python mirrors that:
``cudaMemcpyBatchAsync(dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs,
stream)`` returns ``(err, failIdx)`` from cuda-bindings 12.9 and ``(err,)``
from 13.x; the arguments are the same. Every copy needs an attribute entry
(none is ``cudaErrorInvalidValue``): one entry with stream-ordered source
access covers all, and the stream must not be the legacy NULL stream.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from .extents import check_bounds
from .transfer_batch import TransferBatch

MIN_CUDA_VERSION = 12080


@dataclass(frozen=True, slots=True)
class Spans:
    """Byte spans of one batch: ``sizes[i]`` bytes from ``srcs[i]`` to ``dsts[i]``."""

    dsts: tuple[int, ...]
    srcs: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def num_bytes(self) -> int:
        return sum(self.sizes)


def batch_spans(src_pool: torch.Tensor, dst_pool: torch.Tensor, batch: TransferBatch) -> Spans:
    """One span per extent of two contiguous block-first pools."""
    if not (src_pool.is_contiguous() and dst_pool.is_contiguous()):
        raise ValueError("batched copies need contiguous block-first pools")
    if src_pool.shape[1:] != dst_pool.shape[1:] or src_pool.dtype != dst_pool.dtype:
        raise ValueError(f"pools differ per block: {src_pool.shape} vs {dst_pool.shape}")
    check_bounds(batch, src_pool.shape[0], dst_pool.shape[0])
    block_bytes = src_pool[0].numel() * src_pool.element_size()
    s0, d0 = src_pool.data_ptr(), dst_pool.data_ptr()
    return Spans(
        tuple(d0 + e.dst_start * block_bytes for e in batch.extents),
        tuple(s0 + e.src_start * block_bytes for e in batch.extents),
        tuple(e.num_blocks * block_bytes for e in batch.extents),
    )


def _runtime() -> Any:
    from cuda.bindings import runtime  # noqa: PLC0415 - cuda-python is optional

    return runtime


@functools.cache
def memcpy_batch_available() -> bool:
    """A CUDA device, cuda-python, and runtime and driver >= 12.8."""
    if not torch.cuda.is_available():
        return False
    try:
        rt = _runtime()
    except ImportError:
        return False
    err, runtime_version = rt.cudaRuntimeGetVersion()
    err2, driver_version = rt.cudaDriverGetVersion()
    ok = rt.cudaError_t.cudaSuccess
    if not (
        err == ok
        and err2 == ok
        and min(runtime_version, driver_version) >= MIN_CUDA_VERSION
        and hasattr(rt, "cudaMemcpyBatchAsync")
    ):
        return False
    return _self_test()


def _self_test() -> bool:
    """Two spans host-to-device through the call, checked: torch's streams
    and cuda-python's runtime must agree on the context for this to work."""
    try:
        host = torch.arange(64, dtype=torch.int32).pin_memory()
        dev = torch.zeros(64, dtype=torch.int32, device="cuda")
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream())
        b = host.element_size()
        spans = Spans(
            (dev.data_ptr(), dev.data_ptr() + 40 * b),
            (host.data_ptr(), host.data_ptr() + 40 * b),
            (8 * b, 24 * b),
        )
        memcpy_batch_async(spans, stream)
        stream.synchronize()
        want = torch.zeros(64, dtype=torch.int32)
        want[:8] = host[:8]
        want[40:] = host[40:]
        return bool(torch.equal(dev.cpu(), want))
    except Exception:  # any failure means: use another path
        return False


def memcpy_batch_async(spans: Spans, stream: torch.cuda.Stream) -> None:
    """Enqueue every span on ``stream`` in one ``cudaMemcpyBatchAsync``."""
    if not spans.sizes:
        return
    rt = _runtime()
    attrs = rt.cudaMemcpyAttributes()
    attrs.srcAccessOrder = rt.cudaMemcpySrcAccessOrder.cudaMemcpySrcAccessOrderStream
    attrs.flags = rt.cudaMemcpyFlags.cudaMemcpyFlagPreferOverlapWithCompute
    result = rt.cudaMemcpyBatchAsync(
        list(spans.dsts),
        list(spans.srcs),
        list(spans.sizes),
        len(spans.sizes),
        [attrs],
        [0],
        1,
        rt.cudaStream_t(stream.cuda_stream),
    )
    err = result[0]
    if err != rt.cudaError_t.cudaSuccess:
        fail = f" (copy {result[1]})" if len(result) > 1 else ""
        raise RuntimeError(f"cudaMemcpyBatchAsync failed: {err}{fail}")


def run_batch_memcpy(
    src_pool: torch.Tensor,
    dst_pool: torch.Tensor,
    batch: TransferBatch,
    stream: torch.cuda.Stream | None = None,
) -> None:
    """The batch in one call on ``stream`` (default: the current stream; the
    legacy default stream, which the call rejects, is bridged by a side
    stream ordered after it and before its next work)."""
    spans = batch_spans(src_pool, dst_pool, batch)
    current = stream if stream is not None else torch.cuda.current_stream()
    if current.cuda_stream != 0:
        memcpy_batch_async(spans, current)
        return
    side = torch.cuda.Stream(device=current.device)  # type: ignore[no-untyped-call]
    side.wait_stream(current)
    memcpy_batch_async(spans, side)
    current.wait_stream(side)
