"""AQUA's completely fair scheduler as a replay policy: every k iterations,
or when a request completed, the engine's state goes through the same
`partition_batch` the service runs (planner.policies.aqua.cfs), and its plan
becomes the engine's moves: requests on the GPU but not in the partition
are paged out (swapped to the paging pool), those in it but not on the GPU
are paged in (resumed) or admitted, and the iteration runs the resident
ones. Between reschedules the partition holds: nothing is paged or admitted.

What the engine's columns say, in the policy's terms: a request's prompt is
its current prefill target (the prompt, plus the tokens a recompute
preemption must redo), its prefilled tokens the KV of that target computed
so far, and its generated tokens the KV beyond it, so that the policy's KV
size is exactly the engine's KV. Requests on the GPU (running) are resident;
queued and paged-out (rotary) ones are not. Ties break by arrival, then by
the trace's ids (by trace order when ids repeat).

With the prefix cache, prompt blocks that running requests share are held
once in the pool but counted in each holder's blocks; the partition counts
them once, outside: the pool it fills is the free blocks and the running
requests' own ones, and each request's size (and prefill progress) leaves
out the prompt tokens in its shared blocks. Paging a sharer out frees only
its own blocks, as in the engine; a shared block whose holders are all
paged out would be freed too, which the partition does not count.

The engine carries the paging out with its swaps: paged-out KV travels over
the paging link while the iteration computes (what does not fit stalls it),
and a paged-in request runs from the next iteration, once its KV is back.
Where the paging goes, host DRAM over PCIe or a peer GPU over NVLink, is the
engine's CPU pool and link (planner.replay.cfs_paging). A page-out the
paging pool has no room for is left out (the request stays on the GPU, and a
page-in that needed its room waits): the engine would drop that KV instead,
and a partition that then saw no progress would choose the request again and
again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from planner.domain.placement import CfsInputs, CfsPlan, CfsRequest
from planner.policies.aqua.cfs import partition_batch, should_reschedule
from planner.replay.schedulers import EngineView, SchedulePlan
from planner.replay.state import IntArray, Phase, RequestColumns

CFS_DRAM = "cfs"
CFS_PEER = "cfs-peer"
CFS_POLICY_NAMES = (CFS_DRAM, CFS_PEER)
# k, as CfsInputs has it.
DEFAULT_RESCHEDULE_EVERY = 8

_NO_ROWS: IntArray = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True, slots=True)
class CfsKnobs:
    # b: the engine's per-iteration token budget.
    token_budget: int = 2048
    # k: iterations a partition holds (unless a request completes first).
    reschedule_every: int = DEFAULT_RESCHEDULE_EVERY


@dataclass
class Cfs:
    name: str = CFS_DRAM
    knobs: CfsKnobs = field(default_factory=CfsKnobs)
    # Paged-out requests keep their KV in the paging pool (swap); their CPU
    # copies are not kept once they are paged back in.
    swaps: bool = True
    keeps_cpu_copies: bool = False
    # The plan's page-ins in its order, skipping one that does not fit.
    in_order: bool = False
    # Asked at every iteration so that k counts them all; with nobody
    # waiting every resident request is a decode that fits, so the plan is
    # empty then.
    idle_unless_waiting: bool = False
    copies_only_unless_waiting: bool = True
    running_first: bool = False
    starts_queue_only: bool = False
    # Partitions made so far, and the latest.
    partitions: int = field(default=0, init=False)
    latest: CfsPlan | None = field(default=None, init=False)
    _iteration: int = field(default=0, init=False)
    # Rows that could have completed since the last call.
    _watched: IntArray = field(default_factory=lambda: _NO_ROWS, init=False, repr=False)

    def plan(self, view: EngineView) -> SchedulePlan:
        iteration = self._iteration
        self._iteration += 1
        r = view.requests
        completed = bool((r.phase[self._watched] == Phase.FINISHED).any())
        # With nothing on the GPU a held partition would leave the engine idle.
        if len(view.running) and not should_reschedule(iteration, self.latest, completed):
            self._watched = view.running
            return SchedulePlan()
        rows = np.concatenate((view.queued, view.running, view.rotary))
        ids = _policy_ids(r, rows)
        resident = len(view.queued), len(view.queued) + len(view.running)
        shared = _shared_blocks(view)
        requests = tuple(
            _cfs_request(
                r,
                row,
                id,
                resident[0] <= i < resident[1],
                shared.get(row, 0) * view.block_size_tokens,
            )
            for i, (row, id) in enumerate(zip(rows.tolist(), ids, strict=True))
        )
        # The GPU pool less the blocks running requests share (each held once,
        # outside the partition): requests swapped in last iteration run by now.
        own = int(r.gpu_blocks[view.running].sum()) - sum(shared.values())
        gpu_blocks = view.free_gpu_blocks + own
        plan = partition_batch(
            CfsInputs(
                requests=requests,
                token_budget=self.knobs.token_budget,
                gpu_blocks=gpu_blocks,
                block_size=view.block_size_tokens,
                reschedule_every=self.knobs.reschedule_every,
                iteration=iteration,
            )
        )
        self.latest = plan
        self.partitions += 1
        row_of = dict(zip(ids, rows.tolist(), strict=True))
        page_out = _pageable(r, _rows(row_of, plan.page_out_ids), view.free_cpu_blocks)
        start = _rows(row_of, plan.page_in_ids)
        self._watched = np.concatenate((view.running, start))
        return SchedulePlan(swap_out=page_out, start=start)


def _policy_ids(r: RequestColumns, rows: IntArray) -> list[str]:
    """The trace's ids; when they repeat, the row (zero-padded: trace order)."""
    if r.row_of is not None:
        return [r.ids[row] for row in rows.tolist()]
    width = len(str(len(r)))
    return [str(row).zfill(width) for row in rows.tolist()]


def _shared_blocks(view: EngineView) -> dict[int, int]:
    """Each running row's GPU blocks that other running requests hold too
    (prefix-cached prompt blocks); none without a prefix cache."""
    prefix = view.prefix
    if prefix is None:
        return {}
    counts = {row: prefix.shared_blocks(row) for row in view.running.tolist()}
    return {row: count for row, count in counts.items() if count}


def _cfs_request(
    r: RequestColumns, row: int, id: str, resident: bool, shared_tokens: int = 0
) -> CfsRequest:
    """The request in the policy's terms; shared_tokens: the KV at the start
    of its prompt held in blocks it shares with other running requests,
    left out (the partition counts those blocks once, outside)."""
    target = int(r.prefill_target[row])
    kv = int(r.kv_tokens[row])
    prefilled = min(kv, target)
    return CfsRequest(
        id=id,
        prompt_tokens=target - shared_tokens,
        prefilled_tokens=prefilled - shared_tokens,
        generated_tokens=kv - prefilled,
        resident=resident,
        arrival_s=float(r.arrival_s[row]),
    )


def _pageable(r: RequestColumns, rows: IntArray, free_blocks: int) -> IntArray:
    """The page-outs the paging pool takes, in the plan's order. The engine
    would drop the KV of the others (recompute), and the partition, seeing
    them with no progress, would choose them again: they stay resident."""
    if not len(rows):
        return rows
    blocks = r.gpu_blocks[rows]
    nothing_computed = r.kv_tokens[rows] == 0
    keep = np.zeros(len(rows), dtype=bool)
    for i, (need, free_to_drop) in enumerate(
        zip(blocks.tolist(), nothing_computed.tolist(), strict=True)
    ):
        if free_to_drop:
            keep[i] = True
        elif need <= free_blocks:
            keep[i] = True
            free_blocks -= need
    return rows[keep]


def _rows(row_of: dict[str, int], ids: tuple[str, ...]) -> IntArray:
    if not ids:
        return _NO_ROWS
    return np.array([row_of[id] for id in ids], dtype=np.int64)
