"""What the serverless topology keeps per request, per model set up on a
slice and per MIG slice, beside the slices' batching cores
(planner.replay.batching_core): a request's place in line and where its KV
is, a resident model's turn order of requests, a slice's residents and its
KV room. A request's tokens and KV are the run's request columns
(planner.replay.state), which the cores advance."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from planner.policies.serverless import RhoTuner
from planner.profiles.mig import MigSliceProfile
from planner.replay.batching_core import BatchingCore
from planner.replay.state import FloatArray, IntArray, RequestColumns


@dataclass(slots=True, eq=False)
class SlicedRequest:
    """One request: its row in the run's columns, its model, its place in
    line and where its KV is."""

    columns: RequestColumns
    row: int
    model: str
    priority: float
    prompt_tokens: int
    output_tokens: int
    arrival_s: float
    slo_ttft_s: float
    slo_tbt_s: float
    # Arrival, or when it was last preempted off a slice.
    waiting_since: float
    # Its prefill chunk (0 until it is chosen).
    chunk: int = 0
    # Its KV is on its slice (or the request may start) from then on.
    ready_s: float = 0.0
    # Its KV is in host memory (preempted or swapped out for room).
    kv_in_host: bool = False
    # Its arrival found no slice running its model.
    cold: bool = False

    # The columns read at every step (their rows change, never the arrays).
    _generated: IntArray = field(init=False, repr=False)
    _kv_tokens: IntArray = field(init=False, repr=False)
    _first_token_s: FloatArray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._generated = self.columns.generated
        self._kv_tokens = self.columns.kv_tokens
        self._first_token_s = self.columns.first_token_s

    @property
    def seq(self) -> int:
        return self.row

    @property
    def generated(self) -> int:
        count: int = self._generated.item(self.row)
        return count

    @property
    def kv_tokens(self) -> int:
        tokens: int = self._kv_tokens.item(self.row)
        return tokens

    @property
    def prefilled(self) -> int:
        if self._generated.item(self.row):
            return self.prompt_tokens
        tokens: int = self._kv_tokens.item(self.row)
        return tokens

    @property
    def prefill_done(self) -> bool:
        return self.prefilled >= self.prompt_tokens

    @property
    def deadline_s(self) -> float:
        """Its TTFT deadline before the first token; after it, when its mean
        TPOT so far would reach the target if no token came."""
        generated: int = self._generated.item(self.row)
        if not generated:
            return self.arrival_s + self.slo_ttft_s
        first: float = self._first_token_s.item(self.row)
        return first + (generated - 1) * self.slo_tbt_s

    def start_by(self, per_token_s: float) -> float:
        """When it must run by: its deadline, brought forward before its
        first token by the prefill it has left at per_token_s a token."""
        row = self.row
        generated: int = self._generated.item(row)
        if generated:
            first: float = self._first_token_s.item(row)
            return first + (generated - 1) * self.slo_tbt_s
        kv: int = self._kv_tokens.item(row)
        return self.arrival_s + self.slo_ttft_s - (self.prompt_tokens - kv) * per_token_s

    def slack_s(self, now: float) -> float:
        return self.deadline_s - now


def wait_key(r: SlicedRequest) -> tuple[float, int]:
    """The order of the wait queue: oldest first (arrival or preemption)."""
    return (r.waiting_since, r.row)


@dataclass(slots=True, eq=False)
class Resident:
    """A model set up on a slice, with its requests there: its queue (the
    next to prefill first; those whose KV is in host memory move back in
    from its head) and its running requests (prefill done, oldest first)."""

    model: str
    priority: float
    # It can run from then (inf while its weights load).
    ready_s: float
    active_since_s: float
    last_used_s: float
    queue: deque[SlicedRequest] = field(default_factory=deque)
    running: list[SlicedRequest] = field(default_factory=list)
    tuner: RhoTuner | None = None
    # The switch record its weight load completes.
    loading: int | None = None
    # Its weight bytes in the slice's HBM (the rest streams), and those
    # being copied in while it runs (HBM already taken).
    resident_bytes: float = 0.0
    copying_bytes: float = 0.0
    # Draining for this resident (set up once this one's requests are done)
    # since then.
    successor: Resident | None = None
    drain_since_s: float = 0.0
    # Leaving its slice (shed from a busy shared slice): it takes no new
    # requests and goes once those in flight are done.
    leaving: bool = False
    # Its weights are being read from disk into host memory; its weight
    # copy into HBM finished meanwhile (a pipelined load); its switch record.
    disk_pending: bool = False
    copied: bool = False
    record: int = -1

    @property
    def in_flight(self) -> int:
        return len(self.queue) + len(self.running)

    @property
    def requests(self) -> list[SlicedRequest]:
        return [*self.queue, *self.running]


NOBODY = Resident("", 0.0, math.inf, math.inf, 0.0)


@dataclass(slots=True, eq=False)
class Slice:
    """A MIG slice: its batching core (the requests placed on it), its
    residents and its KV room in tokens."""

    index: int
    id: str
    profile: MigSliceProfile
    kv_capacity: int
    core: BatchingCore
    # The models set up on it, in the order they take turns.
    residents: list[Resident] = field(default_factory=list)
    # The resident whose turn is next.
    turn: int = 0
    # An iteration event is pending; the current iteration ends then.
    busy: bool = False
    iter_end_s: float = 0.0
    rate_gbps: float = 0.0
    # HBM for weights and KV (less the runtime reserve).
    free_bytes: float = 0.0
    # When its busy residents' share is next weighed (``end_share``).
    share_check_at_s: float = 0.0

    @property
    def in_flight(self) -> int:
        return sum(r.in_flight for r in self.residents)

    @property
    def resident_bytes(self) -> float:
        return sum(r.resident_bytes + r.copying_bytes for r in self.residents)

    @property
    def kv_used(self) -> int:
        """KV tokens on the slice (its requests' whose KV is not in host
        memory)."""
        kv = self.core.state.scalars.kv_tokens
        used = 0
        for r in self.residents:
            for q in r.queue:
                if not q.kv_in_host:
                    used += kv[q.row]
            for q in r.running:
                if not q.kv_in_host:
                    used += kv[q.row]
        return used

    def resident(self, model: str) -> Resident | None:
        """Its resident ``model`` that takes requests (not draining)."""
        return next(
            (
                r
                for r in self.residents
                if r.model == model and r.successor is None and not r.leaving
            ),
            None,
        )
