"""End-to-end rotation correctness harness (issue 8, item 4).

A tiny transformer decodes a batch from a block-first paged KV cache while a
script swaps requests out to a CPU pool and back in, the way DuplexKV carries
out rotation plans: each iteration builds the plan's ``TransferBatch`` per
direction and runs them through ``DuplexEngine``.

- eager: newly full blocks of running requests are copied out in the
  background and become SYNCED (valid CPU copy);
- swap out: a preempted request's SYNCED GPU blocks are released at once,
  its DIRTY blocks copied out (their GPU blocks free once the D2H is done);
- swap in: a resumed request's blocks are copied into free GPU blocks, which
  may be ones released in the same iteration (never a D2H source in flight).

Released GPU blocks and the CPU pool are poisoned with NaN, so a read of a
block that was not copied shows up in the logits. The same script run with
``rotate=False`` pauses and resumes the same requests at the same steps but
moves nothing: tokens and logits must be equal.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from .duplex import DuplexEngine, Method
from .extents import make_batch
from .layout import KVLayout, KVShape, allocate
from .tiny_model import TinyTransformer
from .transfer_batch import CopyDirection, TransferBatch


@dataclass(frozen=True, slots=True)
class RotationEvent:
    """Before decode step ``step``: swap ``swap_out`` out, ``swap_in`` back in."""

    step: int
    swap_out: tuple[str, ...] = ()
    swap_in: tuple[str, ...] = ()


class State(enum.Enum):
    RUNNING = 1
    ROTARY = 2


@dataclass
class Seq:
    id: str
    prompt: list[int]
    generated: list[int] = field(default_factory=list)
    pos: int = 0
    state: State = State.RUNNING
    gpu: list[int] = field(default_factory=list)
    cpu: dict[int, int] = field(default_factory=dict)

    def next_token(self) -> int:
        return self.prompt[self.pos] if self.pos < len(self.prompt) else self.generated[-1]


class FreeList:
    def __init__(self, n: int) -> None:
        self._free = set(range(n))

    def take(self, n: int) -> list[int]:
        if n > len(self._free):
            raise MemoryError(f"{n} blocks wanted, {len(self._free)} free")
        out = sorted(self._free)[:n]
        self._free.difference_update(out)
        return out

    def give(self, ids: Sequence[int]) -> None:
        self._free.update(ids)

    def __len__(self) -> int:
        return len(self._free)


@dataclass
class DecodeResult:
    tokens: dict[str, list[int]]
    logits: dict[str, list[torch.Tensor]]
    plans: list[tuple[TransferBatch, ...]] = field(default_factory=list)
    reused_same_step: int = 0


def run_decode(
    model: TinyTransformer,
    prompts: Mapping[str, Sequence[int]],
    steps: int,
    events: Sequence[RotationEvent] = (),
    *,
    rotate: bool = True,
    eager: bool = True,
    method: Method = Method.AUTO,
    duplex: bool = True,
    gpu_blocks: int = 64,
    cpu_blocks: int = 64,
) -> DecodeResult:
    c = model.config
    shape = KVShape(c.num_layers, gpu_blocks, c.block_size, c.num_kv_heads, c.head_dim)
    dev = model.device
    nan = float("nan")
    gpu_pool = allocate(shape, KVLayout.BLOCK_FIRST, dtype=model.dtype, device=dev, fill=nan)
    cpu_pool = allocate(
        shape.with_blocks(cpu_blocks), KVLayout.BLOCK_FIRST, dtype=model.dtype, pin=True, fill=nan
    )
    engine = DuplexEngine(gpu_pool, cpu_pool, method=method, duplex=duplex)
    gpu_free, cpu_free = FreeList(gpu_blocks), FreeList(cpu_blocks)
    seqs = {rid: Seq(rid, list(p)) for rid, p in prompts.items()}
    result = DecodeResult({rid: [] for rid in seqs}, {rid: [] for rid in seqs})
    by_step: dict[int, list[RotationEvent]] = {}
    for ev in events:
        by_step.setdefault(ev.step, []).append(ev)
    bs = c.block_size

    for step in range(steps):
        outs = [rid for ev in by_step.get(step, []) for rid in ev.swap_out]
        ins = [rid for ev in by_step.get(step, []) for rid in ev.swap_in]
        if rotate:
            d2h: list[tuple[int, int]] = []
            h2d: list[tuple[int, int]] = []
            released: list[int] = []
            freed_after: list[int] = []
            for rid in outs:
                s = seqs[rid]
                for i, g in enumerate(s.gpu):
                    if i in s.cpu:
                        released.append(g)
                    else:
                        s.cpu[i] = cpu_free.take(1)[0]
                        d2h.append((g, s.cpu[i]))
                        freed_after.append(g)
                s.gpu = []
            if eager:
                for s in seqs.values():
                    if s.state is State.RUNNING and s.id not in outs:
                        for i in range(s.pos // bs):
                            if i not in s.cpu:
                                s.cpu[i] = cpu_free.take(1)[0]
                                d2h.append((s.gpu[i], s.cpu[i]))
            if released:
                gpu_pool[torch.tensor(released, device=dev)] = nan
            gpu_free.give(released)
            for rid in ins:
                s = seqs[rid]
                s.gpu = gpu_free.take(len(s.cpu))
                h2d.extend((s.cpu[i], g) for i, g in enumerate(s.gpu))
                result.reused_same_step += len(set(s.gpu) & set(released))
            block_bytes = shape.block_elems * gpu_pool.element_size()
            plan = tuple(
                make_batch(direction, pairs, block_bytes)
                for direction, pairs in ((CopyDirection.D2H, d2h), (CopyDirection.H2D, h2d))
                if pairs
            )
            handle = engine.submit(plan)
            if dev.type == "cuda":
                handle.wait(torch.cuda.current_stream(dev))
            handle.d2h.wait()
            if freed_after:
                gpu_pool[torch.tensor(freed_after, device=dev)] = nan
            gpu_free.give(freed_after)
            result.plans.append(plan)
        for rid in outs:
            seqs[rid].state = State.ROTARY
        for rid in ins:
            seqs[rid].state = State.RUNNING

        running = [s for s in seqs.values() if s.state is State.RUNNING]
        if not running:
            continue
        for s in running:
            block = s.pos // bs
            if block == len(s.gpu):
                s.gpu.extend(gpu_free.take(1))
            if rotate and block in s.cpu:  # written again: the CPU copy is stale
                cpu_free.give([s.cpu.pop(block)])
        width = max(len(s.gpu) for s in running)
        tables = torch.tensor([s.gpu + [0] * (width - len(s.gpu)) for s in running])
        tokens = torch.tensor([s.next_token() for s in running])
        positions = torch.tensor([s.pos for s in running])
        logits = model.step(tokens, positions, gpu_pool, KVLayout.BLOCK_FIRST, tables).cpu()
        for row, s in enumerate(running):
            result.logits[s.id].append(logits[row])
            if s.pos >= len(s.prompt) - 1:
                token = int(torch.argmax(logits[row]))
                s.generated.append(token)
                result.tokens[s.id].append(token)
            s.pos += 1
    return result
