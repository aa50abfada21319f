"""Token-Deposit on vLLM's output path (OrbitFlow §3.2, DESIGN.md §3.2):
the decode tokens of a request running under a layer-offload plan go into
its deposit instead of straight to the user, and one is released per TBT
SLO interval (TokenDeposit, through the in-process shim planner.in_process,
keeps the schedule); on finish the rest goes out with the finishing output.

The extension point is the scheduler's update_from_output, whose return
value (EngineCoreOutputs per client) is exactly what the engine core sends
to the front end: held tokens are taken out of the request's
EngineCoreOutput (dropped when nothing else is in it; its request events
ride on the next output of that request) and released tokens go out in the
request's output of a later step, or in one made for them. Releases happen
when the engine steps, so they are as fine-grained as its steps.

Not deposited: the first token (TTFT covers it) and any output carrying
per-token data the deposit would have to split (logprobs, sampling masks,
routed experts), pooling or KV-transfer data; such an output flushes the
request's deposit and closes it."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs

from planner.in_process.deposit import DepositEvents, TokenDeposit

if TYPE_CHECKING:
    from vllm.v1.engine import EngineCoreEvent


@dataclass(slots=True)
class DepositCounts:
    # Tokens put into deposits, released on the SLO schedule, flushed at a
    # finish (or at an output the deposit cannot hold), dropped with an
    # aborted request; deposit-empty-at-release-time violations.
    deposited: int = 0
    released: int = 0
    flushed: int = 0
    dropped: int = 0
    violations: int = 0
    max_balance: int = 0


@dataclass(slots=True)
class OutputDeposit:
    deposit: TokenDeposit = field(default_factory=TokenDeposit)
    counts: DepositCounts = field(default_factory=DepositCounts)
    _client: dict[str, int] = field(default_factory=dict)
    _events: dict[str, list[EngineCoreEvent]] = field(default_factory=dict)

    def balance(self, request_id: str) -> int:
        return self.deposit.balances().get(request_id, 0)

    def apply(
        self,
        outputs: dict[int, EngineCoreOutputs],
        depositing: Mapping[str, float],
        live: Collection[str],
        now_s: float,
    ) -> dict[int, EngineCoreOutputs]:
        """Filter one step's outputs. depositing: the requests whose tokens
        go into a deposit (id -> TBT SLO); live: the requests the scheduler
        still holds (an open deposit of a request neither live nor in this
        step's outputs belongs to an aborted request)."""
        now_s = max(now_s, self.deposit.now_s)
        released: dict[str, list[int]] = {}
        self._released(self.deposit.advance(now_s), released)
        present = {out.request_id for batch in outputs.values() for out in batch.outputs}
        for rid in [r for r in self.deposit.request_ids() if r not in live and r not in present]:
            # Aborted: the front end has forgotten it.
            gone = len(released.pop(rid, []))
            self.counts.released -= gone
            self.counts.dropped += self.deposit.balance(rid) + gone
            self.deposit.finish(rid, now_s)
            self._forget(rid)
        open_ids = set(self.deposit.request_ids())
        for client, batch in outputs.items():
            kept: list[EngineCoreOutput] = []
            for out in batch.outputs:
                rid = out.request_id
                if rid in open_ids:
                    kept.extend(self._through_deposit(out, now_s, released))
                    if rid not in self._client:
                        open_ids.discard(rid)
                    continue
                if (
                    rid in depositing
                    and out.finish_reason is None
                    and out.new_token_ids
                    and _holdable(out)
                ):
                    # Its latest visible token goes out now and anchors the
                    # release schedule.
                    self.deposit.open(rid, now_s, depositing[rid])
                    self._client[rid] = client
                    open_ids.add(rid)
                kept.append(out)
            batch.outputs = kept
        for rid, tokens in released.items():
            if tokens:
                client = self._client[rid]
                extra = outputs.get(client)
                if extra is None:
                    extra = outputs[client] = EngineCoreOutputs()
                extra.outputs = [
                    *extra.outputs,
                    EngineCoreOutput(request_id=rid, new_token_ids=tokens, events=self._take(rid)),
                ]
        for rid in self.deposit.request_ids():
            self.counts.max_balance = max(self.counts.max_balance, self.deposit.balance(rid))
        return outputs

    def _through_deposit(
        self, out: EngineCoreOutput, now_s: float, released: dict[str, list[int]]
    ) -> list[EngineCoreOutput]:
        """What goes out for one output of a request with an open deposit."""
        rid = out.request_id
        if not _holdable(out):
            # Held tokens first, in an output of their own; this one as is.
            self._released(self.deposit.finish(rid, now_s), released)
            flush = EngineCoreOutput(
                request_id=rid, new_token_ids=released.pop(rid, []), events=self._take(rid)
            )
            self._forget(rid)
            return [flush, out] if flush.new_token_ids or flush.events else [out]
        self._deposit_tokens(rid, out.new_token_ids, now_s, released)
        if out.finish_reason is not None:
            self._released(self.deposit.finish(rid, now_s), released)
            out = self._with_released(out, released.pop(rid, []))
            self._forget(rid)
            return [out]
        if out.events:
            self._events.setdefault(rid, []).extend(out.events)
        tokens = released.pop(rid, [])
        if not tokens:
            return []
        out.events = None
        return [self._with_released(out, tokens)]

    def _deposit_tokens(
        self, rid: str, tokens: list[int], now_s: float, released: dict[str, list[int]]
    ) -> None:
        if tokens:
            self.counts.deposited += len(tokens)
            self._released(self.deposit.deposit(rid, now_s, token_ids=tokens), released)

    def _released(self, events: DepositEvents, into: dict[str, list[int]]) -> None:
        for release in events.releases:
            into.setdefault(release.request_id, []).append(release.token_id)
            if release.flushed:
                self.counts.flushed += 1
            else:
                self.counts.released += 1
        self.counts.violations += len(events.violations)

    def _with_released(self, out: EngineCoreOutput, tokens: list[int]) -> EngineCoreOutput:
        out.new_token_ids = tokens
        pending = self._take(out.request_id)
        if pending:
            out.events = pending + list(out.events or [])
        return out

    def _take(self, rid: str) -> list[EngineCoreEvent] | None:
        return self._events.pop(rid, None)

    def _forget(self, rid: str) -> None:
        self._client.pop(rid, None)
        self._events.pop(rid, None)


def _holdable(out: EngineCoreOutput) -> bool:
    """Only token ids: nothing per token the deposit would have to split."""
    return (
        out.new_logprobs is None
        and out.new_sampling_mask is None
        and out.routed_experts is None
        and out.pooling_output is None
        and out.kv_transfer_params is None
        and out.new_prompt_logprobs_tensors is None
        and out.prefill_stats is None
    )
