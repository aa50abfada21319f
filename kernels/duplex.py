"""Full-duplex execution of a rotation plan (SuperInfer DuplexKV).

The D2H batch and the H2D batch of one iteration run on two streams at once;
the rotation invariant (no H2D destination is a D2H source in flight) makes
that race-free, and it is checked before anything is launched. Each
direction records an event so the caller knows when its batch is done: the
compute stream waits on the H2D event before it reads swapped-in blocks, and
the allocator frees D2H sources once the D2H event has fired. Across plans,
an H2D batch also waits for the previous plan's D2H (the blocks freed after
it may be its destinations); within a plan the two directions overlap.

On CPU (no CUDA) the same interface runs synchronously, D2H first, and
returns completions that are already done.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from .extents import by_direction, check_bounds, check_race_free
from .transfer_batch import CopyDirection, TransferBatch
from .transfer_memcpy import memcpy_batch_available, run_batch_memcpy
from .transfer_naive import copy_per_block, copy_per_extent
from .transfer_ref import run_batch_reference
from .triton_support import triton_installed


class PlanWithBatches(Protocol):
    """A plan's copies (planner.domain.rotation.RotationPlan is one)."""

    @property
    def batches(self) -> Sequence[TransferBatch]: ...


class Method(enum.StrEnum):
    """How one direction's batch is carried out."""

    AUTO = "auto"
    REFERENCE = "index_copy"
    TRITON = "triton"
    MEMCPY_BATCH = "memcpy_batch"
    PER_EXTENT = "per_extent"
    PER_BLOCK = "per_block"


Mover = Callable[[torch.Tensor, torch.Tensor, TransferBatch], object]


def _triton(src: torch.Tensor, dst: torch.Tensor, batch: TransferBatch) -> None:
    from .triton_blocks import run_batch_triton  # noqa: PLC0415 - triton is optional

    run_batch_triton(src, dst, batch)


def _memcpy(src: torch.Tensor, dst: torch.Tensor, batch: TransferBatch) -> None:
    run_batch_memcpy(src, dst, batch)


def resolve(method: Method, on_cuda: bool) -> Method:
    """AUTO: ``cudaMemcpyBatchAsync`` where the runtime has it, else Triton
    on a GPU, else the reference."""
    if method is not Method.AUTO:
        return method
    if on_cuda:
        if memcpy_batch_available():
            return Method.MEMCPY_BATCH
        if triton_installed():
            return Method.TRITON
        return Method.PER_EXTENT
    return Method.REFERENCE


MOVERS: dict[Method, Mover] = {
    Method.REFERENCE: run_batch_reference,
    Method.TRITON: _triton,
    Method.MEMCPY_BATCH: _memcpy,
    Method.PER_EXTENT: copy_per_extent,
    Method.PER_BLOCK: copy_per_block,
}


def new_stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device=device)  # type: ignore[no-untyped-call]


class Completion:
    """When one direction's batch is done: a CUDA event, or nothing to wait
    for (CPU, or an empty batch)."""

    def __init__(self, event: torch.cuda.Event | None = None) -> None:
        self._event = event

    @property
    def event(self) -> torch.cuda.Event | None:
        return self._event

    def query(self) -> bool:
        return self._event is None or bool(self._event.query())  # type: ignore[no-untyped-call]

    def wait(self, stream: torch.cuda.Stream | None = None) -> None:
        """Block ``stream``'s later work on it; without a stream, block the host."""
        if self._event is None:
            return
        if stream is None:
            self._event.synchronize()
        else:
            stream.wait_event(self._event)


@dataclass(frozen=True, slots=True)
class DuplexHandle:
    d2h: Completion
    h2d: Completion

    def query(self) -> bool:
        return self.d2h.query() and self.h2d.query()

    def wait(self, stream: torch.cuda.Stream | None = None) -> None:
        self.d2h.wait(stream)
        self.h2d.wait(stream)


class DuplexEngine:
    """Moves blocks between a GPU pool and a CPU pool (both block-first,
    contiguous, same per-block shape; the CPU pool page-locked on CUDA).

    ``duplex=False`` serializes the directions (H2D waits for D2H), the
    "MS+MK" configuration of SuperInfer's Table 1.
    """

    def __init__(
        self,
        gpu_pool: torch.Tensor,
        cpu_pool: torch.Tensor,
        *,
        method: Method = Method.AUTO,
        duplex: bool = True,
    ) -> None:
        if gpu_pool.shape[1:] != cpu_pool.shape[1:] or gpu_pool.dtype != cpu_pool.dtype:
            raise ValueError(f"pools differ per block: {gpu_pool.shape} vs {cpu_pool.shape}")
        if cpu_pool.device.type != "cpu":
            raise ValueError("the CPU pool must be in host memory")
        self.gpu_pool = gpu_pool
        self.cpu_pool = cpu_pool
        self.on_cuda = gpu_pool.device.type == "cuda"
        if self.on_cuda and not cpu_pool.is_pinned():
            raise ValueError("on CUDA the CPU pool must be page-locked (pin_memory)")
        self.method = resolve(method, self.on_cuda)
        self.duplex = duplex
        self._streams: tuple[torch.cuda.Stream, torch.cuda.Stream] | None = None
        self._last_d2h: torch.cuda.Event | None = None
        if self.on_cuda:
            dev = gpu_pool.device
            self._streams = (new_stream(dev), new_stream(dev))

    def _pools(self, direction: CopyDirection) -> tuple[torch.Tensor, torch.Tensor]:
        if direction is CopyDirection.D2H:
            return self.gpu_pool, self.cpu_pool
        return self.cpu_pool, self.gpu_pool

    def submit(self, batches: Sequence[TransferBatch]) -> DuplexHandle:
        """Launch a plan's batches (at most one per direction); returns at
        once on CUDA. Work already queued on the current stream (the step
        that wrote the KV) happens before the copies."""
        d2h, h2d = by_direction(batches)
        check_race_free(d2h, h2d)
        for batch in (d2h, h2d):
            if batch is not None:
                src, dst = self._pools(batch.direction)
                check_bounds(batch, src.shape[0], dst.shape[0])
        move = MOVERS[self.method]
        if self._streams is None:
            for batch in (d2h, h2d):
                if batch is not None and batch.extents:
                    move(*self._pools(batch.direction), batch)
            return DuplexHandle(Completion(), Completion())
        current = torch.cuda.current_stream(self.gpu_pool.device)
        done: list[Completion] = []
        previous: torch.cuda.Event | None = None
        for batch, stream in zip((d2h, h2d), self._streams, strict=True):
            if batch is None or not batch.extents:
                done.append(Completion())
                continue
            stream.wait_stream(current)
            if previous is not None and not self.duplex:
                stream.wait_event(previous)
            if batch.direction is CopyDirection.H2D and self._last_d2h is not None:
                # Blocks the previous plan freed after its D2H may be this
                # plan's destinations: that D2H must be done (this plan's own
                # D2H runs alongside, race-free by the invariant).
                stream.wait_event(self._last_d2h)
            with torch.cuda.stream(stream):
                move(*self._pools(batch.direction), batch)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(stream)
            previous = event
            done.append(Completion(event))
        if done[0].event is not None:
            self._last_d2h = done[0].event
        return DuplexHandle(done[0], done[1])

    def submit_plan(self, plan: PlanWithBatches) -> DuplexHandle:
        return self.submit(plan.batches)
