"""Worker side of layer offload: per layer, fetch the offloaded KV from CPU
memory just before the layer's attention (wait_for_layer_load) and save
what the step wrote back after it (save_kv_layer), with planner.kernels'
reference block copy; measure each layer's fetch and compute time and hand
them to the scheduler through vLLM's worker -> scheduler channel
(KVConnectorOutput.kv_connector_worker_meta)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from planner.kernels.transfer_ref import copy_blocks_reference
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata

from .layer_ledger import LayerStep
from .swap_ledger import BlockCopies


@dataclass(frozen=True)
class LayerTimings(KVConnectorWorkerMetadata):  # type: ignore[misc, unused-ignore]
    """One step as a worker saw it, per layer index: seconds spent fetching
    (the stall before attention could start), blocks fetched, and compute
    seconds (from the end of its fetch to the start of the next layer's,
    its save excluded); step_s from the first layer's fetch to the end."""

    fetch_s: tuple[float, ...]
    fetched_blocks: tuple[int, ...]
    compute_s: tuple[float, ...]
    step_s: float

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        # Tensor-parallel workers run the same plan on their own heads; the
        # step is as slow as the slowest.
        assert isinstance(other, LayerTimings)
        return LayerTimings(
            tuple(map(max, self.fetch_s, other.fetch_s)),
            tuple(map(max, self.fetched_blocks, other.fetched_blocks)),
            tuple(map(max, self.compute_s, other.compute_s)),
            max(self.step_s, other.step_s),
        )

    @property
    def link_blocks_per_s(self) -> float | None:
        """Measured CPU -> GPU rate in one-layer blocks per second."""
        seconds = sum(self.fetch_s)
        blocks = sum(self.fetched_blocks)
        return blocks / seconds if blocks and seconds > 0 else None


class _StepClock:
    """Time marks: wall clock on CPU; CUDA events on a GPU, whose copies and
    kernels run asynchronously to the worker thread."""

    def __init__(self, cuda: bool) -> None:
        self._cuda = cuda
        self._wall: list[float] = []
        self._events: list[torch.cuda.Event] = []

    def mark(self) -> int:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
            self._events.append(event)
            return len(self._events) - 1
        self._wall.append(time.perf_counter())
        return len(self._wall) - 1

    def seconds(self, start: int, end: int) -> float:
        if self._cuda:
            self._events[end].synchronize()
            return float(self._events[start].elapsed_time(self._events[end])) / 1e3
        return self._wall[end] - self._wall[start]


@dataclass(slots=True)
class _LayerMarks:
    fetch_start: int
    fetch_end: int
    save_start: int | None = None
    save_end: int | None = None


class LayerFetcher:
    """gpu_layers / cpu_layers: per layer name, block-major views of the KV
    cache and of its CPU pool; layer_names in the planner's layer order."""

    def __init__(
        self,
        layer_names: list[str],
        gpu_layers: dict[str, torch.Tensor],
        cpu_layers: dict[str, torch.Tensor],
    ) -> None:
        self.layer_index = {name: i for i, name in enumerate(layer_names)}
        self.gpu_layers = gpu_layers
        self.cpu_layers = cpu_layers
        self._names = layer_names
        self._step = LayerStep()
        self._clock = _StepClock(cuda=False)
        self._marks: dict[int, _LayerMarks] = {}

    def begin_step(self, step: LayerStep) -> None:
        self._step = step
        cuda = any(t.is_cuda for t in self.gpu_layers.values())
        self._clock = _StepClock(cuda)
        self._marks = {}

    def restore(self) -> None:
        """Offloaded layers of requests being swapped out, back into their
        GPU blocks (before the swap-out copies read them)."""
        for layer, copies in self._step.restore.items():
            self._copy(copies, self.cpu_layers, self.gpu_layers, self._names[layer])

    def wait_for_layer_load(self, layer_name: str) -> None:
        layer = self.layer_index.get(layer_name)
        if layer is None:
            return
        start = self._clock.mark()
        copies = self._step.fetch.get(layer)
        if copies is not None:
            self._copy(copies, self.cpu_layers, self.gpu_layers, layer_name)
        self._marks[layer] = _LayerMarks(start, self._clock.mark())

    def save_kv_layer(self, layer_name: str) -> None:
        layer = self.layer_index.get(layer_name)
        marks = self._marks.get(layer) if layer is not None else None
        if layer is None:
            return
        save_start = self._clock.mark()
        copies = self._step.save.get(layer)
        if copies is not None:
            self._copy(copies, self.gpu_layers, self.cpu_layers, layer_name)
        if marks is not None:
            marks.save_start, marks.save_end = save_start, self._clock.mark()

    def take_timings(self) -> LayerTimings | None:
        """The step's timings (None when no layer ran); ends the step."""
        marks = self._marks
        if not marks:
            return None
        end = self._clock.mark()
        n = len(self._names)
        fetch = [0.0] * n
        compute = [0.0] * n
        blocks = [len(self._step.fetch[i]) if i in self._step.fetch else 0 for i in range(n)]
        seen = sorted(marks)
        for k, layer in enumerate(seen):
            m = marks[layer]
            fetch[layer] = self._clock.seconds(m.fetch_start, m.fetch_end)
            nxt = marks[seen[k + 1]].fetch_start if k + 1 < len(seen) else end
            saved = (
                self._clock.seconds(m.save_start, m.save_end)
                if m.save_start is not None and m.save_end is not None
                else 0.0
            )
            compute[layer] = max(0.0, self._clock.seconds(m.fetch_end, nxt) - saved)
        step_s = self._clock.seconds(marks[seen[0]].fetch_start, end)
        self._marks = {}
        self._step = LayerStep()
        return LayerTimings(tuple(fetch), tuple(blocks), tuple(compute), step_s)

    def _copy(
        self,
        copies: BlockCopies,
        src: dict[str, torch.Tensor],
        dst: dict[str, torch.Tensor],
        layer_name: str,
    ) -> None:
        if not len(copies):
            return
        copy_blocks_reference(
            src[layer_name], dst[layer_name], torch.tensor(copies.src), torch.tensor(copies.dst)
        )
