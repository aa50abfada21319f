"""LayerOffloadLedger's copies keep every token's KV readable, whatever the
plans do: random plan changes, decode steps, preemptions and finishes, with
the worker's copies played on plain arrays (offloaded GPU copies poisoned
after each save). Before each layer's attention every earlier token of a
scheduled request reads its own value; after a restore a preempted request's
GPU blocks hold all its tokens; CPU blocks never leak."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from planner.adapters.vllm.layer_ledger import LayerOffloadLedger, LayerStep, ScheduledRequest
from planner.adapters.vllm.swap_ledger import BlockCopies

pytestmark = pytest.mark.engines

LAYERS = 3
BLOCK = 4
GPU_BLOCKS = 40
CPU_BLOCKS = 12
POISON = -1
REQUESTS = ("a", "b", "c")


@dataclass
class Worker:
    gpu: np.ndarray = field(default_factory=lambda: np.full((LAYERS, GPU_BLOCKS, BLOCK), POISON))
    cpu: np.ndarray = field(default_factory=lambda: np.full((LAYERS, CPU_BLOCKS, BLOCK), POISON))

    @staticmethod
    def copy(src: np.ndarray, dst: np.ndarray, copies: BlockCopies) -> None:
        dst[copies.dst] = src[copies.src]


def _value(rid: str, position: int) -> int:
    return REQUESTS.index(rid) * 1000 + position


@dataclass
class Live:
    tokens: int
    blocks: list[int]


operation = st.one_of(
    st.tuples(
        st.just("plan"),
        st.dictionaries(st.sampled_from(REQUESTS), st.sets(st.integers(0, LAYERS - 1))),
    ),
    st.tuples(st.just("step"), st.sets(st.sampled_from(REQUESTS), min_size=1)),
    st.tuples(st.just("preempt"), st.sampled_from(REQUESTS)),
    st.tuples(st.just("finish"), st.sampled_from(REQUESTS)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(operation, max_size=40))
def test_every_token_stays_readable_and_no_cpu_block_leaks(operations):
    ledger = LayerOffloadLedger(LAYERS, CPU_BLOCKS, BLOCK)
    worker = Worker()
    free_gpu = list(range(GPU_BLOCKS))
    live: dict[str, Live] = {}
    for kind, arg in operations:
        if kind == "plan":
            ledger.set_targets(arg)
            continue
        if kind in ("preempt", "finish"):
            request = live.pop(arg, None)
            if request is None:
                continue
            if kind == "preempt":
                ledger.preempt(arg, request.blocks, request.tokens)
                step = ledger.take_step()
                for layer, copies in step.restore.items():
                    Worker.copy(worker.cpu[layer], worker.gpu[layer], copies)
                for layer in range(LAYERS):
                    for pos in range(request.tokens):
                        got = worker.gpu[layer, request.blocks[pos // BLOCK], pos % BLOCK]
                        assert got == _value(arg, pos), (arg, layer, pos)
            else:
                ledger.drop(arg)
            free_gpu.extend(request.blocks)
            continue
        # A decode step: each scheduled request writes one token (a new one
        # writes a 5-token prompt).
        scheduled = []
        for rid in sorted(arg):
            request = live.setdefault(rid, Live(0, []))
            n = 5 if request.tokens == 0 else 1
            while len(request.blocks) * BLOCK < request.tokens + n:
                request.blocks.append(free_gpu.pop())
            scheduled.append((rid, request.tokens, n))
            ledger.schedule(ScheduledRequest(rid, request.tokens, n, tuple(request.blocks)))
        step = ledger.take_step()
        _run(worker, step, live, scheduled)
        for rid, start, n in scheduled:
            live[rid].tokens = start + n
    for rid in list(live):
        ledger.drop(rid)
    ledger.take_step()
    assert ledger.free_cpu_blocks == CPU_BLOCKS


def _run(worker: Worker, step: LayerStep, live: dict[str, Live], scheduled) -> None:
    for layer in range(LAYERS):
        if layer in step.fetch:
            Worker.copy(worker.cpu[layer], worker.gpu[layer], step.fetch[layer])
        for rid, start, n in scheduled:
            blocks = live[rid].blocks
            for pos in range(start):
                got = worker.gpu[layer, blocks[pos // BLOCK], pos % BLOCK]
                assert got == _value(rid, pos), (rid, layer, pos)
            for pos in range(start, start + n):
                worker.gpu[layer, blocks[pos // BLOCK], pos % BLOCK] = _value(rid, pos)
        if layer in step.save:
            Worker.copy(worker.gpu[layer], worker.cpu[layer], step.save[layer])
        for block in step.evicted.get(layer, ()):
            worker.gpu[layer, block] = POISON
