"""Scheduler-side bookkeeping of swapped KV: which CPU blocks hold which
preempted request's KV, and the copies the worker must run next step.
Plain Python, no vLLM.

Ordering the worker keeps (see connector.py): a step's D2H copies run before
its H2D copies, and CPU blocks read by a step's H2D copies return to the free
list only after that step's copies were handed out, so no later D2H can
overwrite them first."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SwappedKV:
    # CPU block of logical block i.
    cpu_block_ids: tuple[int, ...]
    # Tokens whose KV those blocks hold.
    num_tokens: int


@dataclass(slots=True)
class BlockCopies:
    """Parallel lists: block src[i] is copied to block dst[i]."""

    src: list[int] = field(default_factory=list)
    dst: list[int] = field(default_factory=list)

    def add(self, src: list[int] | tuple[int, ...], dst: list[int] | tuple[int, ...]) -> None:
        self.src.extend(src)
        self.dst.extend(dst)

    def __len__(self) -> int:
        return len(self.src)


@dataclass(frozen=True, slots=True)
class StepCopies:
    # GPU -> CPU, before the step's KV writes can touch the freed blocks.
    swap_out: BlockCopies
    # CPU -> GPU, before the step's forward reads them.
    swap_in: BlockCopies


class SwapLedger:
    def __init__(self, num_cpu_blocks: int, block_size_tokens: int) -> None:
        if num_cpu_blocks <= 0:
            raise ValueError(f"num_cpu_blocks must be > 0, got {num_cpu_blocks}")
        if block_size_tokens <= 0:
            raise ValueError(f"block_size_tokens must be > 0, got {block_size_tokens}")
        self.num_cpu_blocks = num_cpu_blocks
        self.block_size_tokens = block_size_tokens
        # Popped from the end: lowest ids first.
        self._free = list(range(num_cpu_blocks - 1, -1, -1))
        self._swapped: dict[str, SwappedKV] = {}
        self._swap_out = BlockCopies()
        self._swap_in = BlockCopies()
        self._release_after_step: list[int] = []
        # Requests swapped out, swapped in, and refused (recomputed instead).
        self.swap_outs = 0
        self.swap_ins = 0
        self.refused = 0

    @property
    def free_cpu_blocks(self) -> int:
        return len(self._free)

    def swapped(self, request_id: str) -> SwappedKV | None:
        return self._swapped.get(request_id)

    def swap_out(self, request_id: str, gpu_block_ids: list[int], num_tokens: int) -> bool:
        """Record the D2H copy of a request's KV before vLLM frees its GPU
        blocks. False (vLLM recomputes it instead) when it holds no KV or
        the CPU pool is full."""
        self.drop(request_id)
        num_blocks = -(-num_tokens // self.block_size_tokens)
        if num_tokens <= 0 or num_blocks > len(gpu_block_ids) or num_blocks > len(self._free):
            self.refused += 1
            return False
        cpu_ids = tuple(self._free.pop() for _ in range(num_blocks))
        self._swap_out.add(gpu_block_ids[:num_blocks], cpu_ids)
        self._swapped[request_id] = SwappedKV(cpu_ids, num_tokens)
        self.swap_outs += 1
        return True

    def loadable_tokens(self, request_id: str, total_tokens: int, local_tokens: int) -> int:
        """Tokens beyond local_tokens the CPU copy can restore; the last token
        is always left to compute (vLLM needs one to sample from)."""
        kv = self._swapped.get(request_id)
        if kv is None:
            return 0
        return max(0, min(kv.num_tokens, total_tokens - 1) - local_tokens)

    def swap_in(
        self, request_id: str, gpu_block_ids: list[int], local_tokens: int, num_tokens: int
    ) -> None:
        """Record the H2D copy of tokens [local_tokens, local_tokens+num_tokens)
        into the request's newly allocated GPU blocks (logical order)."""
        kv = self._swapped.pop(request_id)
        size = self.block_size_tokens
        first, end = local_tokens // size, -(-(local_tokens + num_tokens) // size)
        self._swap_in.add(kv.cpu_block_ids[first:end], gpu_block_ids[first:end])
        self._release_after_step.extend(kv.cpu_block_ids)
        self.swap_ins += 1

    def drop(self, request_id: str) -> None:
        """Forget a request's CPU copy (finished, aborted, or swapped anew)."""
        kv = self._swapped.pop(request_id, None)
        if kv is not None:
            self._release_after_step.extend(kv.cpu_block_ids)

    def take_step(self) -> StepCopies:
        """The copies of the step being scheduled; starts the next one."""
        step = StepCopies(self._swap_out, self._swap_in)
        self._swap_out, self._swap_in = BlockCopies(), BlockCopies()
        self._free.extend(sorted(self._release_after_step, reverse=True))
        self._release_after_step = []
        return step
