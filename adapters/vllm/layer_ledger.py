"""Scheduler-side bookkeeping of layer offload (OrbitFlow, DESIGN.md §3.2):
which layers of which running request keep their KV in CPU memory, in which
CPU blocks, and the per-layer copies the worker runs around each layer's
attention in the step being scheduled. Plain Python, no vLLM.

vLLM gives a request one block id across all layers, so a layer's GPU slots
cannot be handed to another request; an offloaded layer's GPU copy is stale
from the moment it is saved, and the CPU copy is the one attention reads
(fetched just before it, in wait_for_layer_load). For a request scheduled
with `start` computed tokens and `n` new ones, at layer l:

- offloaded before and after: fetch the blocks of its first `start` tokens,
  save the blocks this step writes;
- newly offloaded: nothing to fetch (the GPU copy is current), save every
  block it has after the step;
- offloaded before, resident now: fetch, no save (the GPU copy is current
  again).

CPU blocks of a request that leaves offload are reused only from the next
step on, so no later save overwrites them before this step's fetches."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .swap_ledger import BlockCopies


@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    request_id: str
    # Tokens whose KV was written before this step, and tokens it writes.
    start_tokens: int
    new_tokens: int
    # The request's GPU blocks in logical order.
    gpu_block_ids: tuple[int, ...]


@dataclass(slots=True)
class LayerStep:
    """Per layer index: CPU -> GPU before its attention, GPU -> CPU after it,
    and GPU blocks whose copy is stale once the layer is saved."""

    fetch: dict[int, BlockCopies] = field(default_factory=dict)
    save: dict[int, BlockCopies] = field(default_factory=dict)
    evicted: dict[int, list[int]] = field(default_factory=dict)
    # CPU -> GPU of every offloaded layer of requests preempted to be
    # swapped: run before the swap-out copies read their GPU blocks.
    restore: dict[int, BlockCopies] = field(default_factory=dict)

    def fetched_blocks(self) -> int:
        return sum(len(c) for c in self.fetch.values())


@dataclass(slots=True)
class _Offloaded:
    layers: frozenset[int]
    cpu_block_ids: list[int]


def _copies(table: dict[int, BlockCopies], layer: int) -> BlockCopies:
    copies = table.get(layer)
    if copies is None:
        copies = table[layer] = BlockCopies()
    return copies


class LayerOffloadLedger:
    def __init__(self, num_layers: int, num_cpu_blocks: int, block_size_tokens: int) -> None:
        if num_layers <= 0:
            raise ValueError(f"num_layers must be > 0, got {num_layers}")
        if num_cpu_blocks <= 0:
            raise ValueError(f"num_cpu_blocks must be > 0, got {num_cpu_blocks}")
        if block_size_tokens <= 0:
            raise ValueError(f"block_size_tokens must be > 0, got {block_size_tokens}")
        self.num_layers = num_layers
        self.num_cpu_blocks = num_cpu_blocks
        self.block_size_tokens = block_size_tokens
        self._free = list(range(num_cpu_blocks - 1, -1, -1))
        self._release_after_step: list[int] = []
        self._targets: dict[str, frozenset[int]] = {}
        self._state: dict[str, _Offloaded] = {}
        self._step = LayerStep()
        # Requests the plan wanted offloaded but the CPU pool could not take.
        self.refused = 0

    @property
    def free_cpu_blocks(self) -> int:
        return len(self._free)

    def set_targets(self, offloaded_layers: Mapping[str, Iterable[int]]) -> None:
        """The plan in force: per request, the layers whose KV lives in CPU
        memory; a request not named keeps every layer resident."""
        targets: dict[str, frozenset[int]] = {}
        for rid, layers in offloaded_layers.items():
            chosen = frozenset(layers)
            bad = [layer for layer in chosen if not 0 <= layer < self.num_layers]
            if bad:
                raise ValueError(f"request {rid!r}: layer {bad[0]} not in [0, {self.num_layers})")
            if chosen:
                targets[rid] = chosen
        self._targets = targets

    def offloaded_layers(self, request_id: str) -> frozenset[int]:
        """The layers of request_id whose KV the CPU holds now."""
        state = self._state.get(request_id)
        return state.layers if state is not None else frozenset()

    def schedule(self, request: ScheduledRequest) -> None:
        """Record this step's copies for one scheduled request."""
        size = self.block_size_tokens
        rid = request.request_id
        state = self._state.get(rid)
        before = state.layers if state is not None else frozenset()
        after = self._targets.get(rid, frozenset())
        end_tokens = request.start_tokens + request.new_tokens
        num_blocks = -(-end_tokens // size)
        if num_blocks > len(request.gpu_block_ids):
            raise ValueError(
                f"request {rid!r}: {end_tokens} tokens need {num_blocks} blocks, "
                f"it has {len(request.gpu_block_ids)}"
            )
        cpu_ids = state.cpu_block_ids if state is not None else []
        if after and num_blocks - len(cpu_ids) > len(self._free):
            self.refused += 1
            after = frozenset()
        if after:
            cpu_ids.extend(self._free.pop() for _ in range(num_blocks - len(cpu_ids)))
        gpu = request.gpu_block_ids
        fetched = -(-request.start_tokens // size)
        for layer in before:
            _copies(self._step.fetch, layer).add(cpu_ids[:fetched], gpu[:fetched])
        first_dirty = request.start_tokens // size
        for layer in after:
            first = first_dirty if layer in before else 0
            _copies(self._step.save, layer).add(gpu[first:num_blocks], cpu_ids[first:num_blocks])
            self._step.evicted.setdefault(layer, []).extend(gpu[:num_blocks])
        if after:
            self._state[rid] = _Offloaded(after, cpu_ids)
        elif state is not None:
            self._release(rid)

    def preempt(self, request_id: str, gpu_block_ids: list[int], num_tokens: int) -> None:
        """request_id is preempted; its KV is about to be swapped out from
        its GPU blocks, so bring its offloaded layers back into them first."""
        state = self._state.get(request_id)
        if state is None:
            return
        blocks = min(-(-num_tokens // self.block_size_tokens), len(state.cpu_block_ids))
        for layer in state.layers:
            _copies(self._step.restore, layer).add(
                state.cpu_block_ids[:blocks], gpu_block_ids[:blocks]
            )
        self._release(request_id)

    def drop(self, request_id: str) -> None:
        """Forget a request (finished, aborted, or preempted to recompute)."""
        if request_id in self._state:
            self._release(request_id)
        self._targets.pop(request_id, None)

    def take_step(self) -> LayerStep:
        """The copies of the step being scheduled; starts the next one."""
        step, self._step = self._step, LayerStep()
        self._free.extend(sorted(self._release_after_step, reverse=True))
        self._release_after_step = []
        return step

    def _release(self, request_id: str) -> None:
        state = self._state.pop(request_id)
        self._release_after_step.extend(state.cpu_block_ids)
