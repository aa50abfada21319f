"""Prefix caching in the single-engine replay: exact small cases (shared
blocks held once, hits skip prefill, eviction order, swaps and recomputes
with shared blocks) and invariants over random traces whose prompts share
prefixes (reference counts, the pool conserved, the cache off or with
nothing to share changing nothing)."""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from planner.api import replay
from planner.cli import main
from planner.domain.requests import Slo
from planner.replay.engine import Engine, EngineConfig
from planner.replay.engine_state import EngineState
from planner.replay.prefix_cache import PrefixCache, PrefixCacheError
from planner.replay.records import ReplayResult
from planner.replay.scheduler_by_name import POLICY_NAMES, make_scheduler
from planner.replay.state import Phase, RequestColumns, blocks_needed_one
from planner.trace.records import TraceRequest
from tests.replay.test_engine import BLOCK_BYTES, AffineCost, Link, rotation_inputs


def req(
    arrival_s: float, prompt: int, output: int, ids: Sequence[int], id: str | None = None
) -> TraceRequest:
    return TraceRequest(
        arrival_s=arrival_s,
        prompt_tokens=prompt,
        output_tokens=output,
        id=id,
        prefix_block_ids=tuple(ids),
    )


def config(
    gpu: int = 64,
    cpu: int = 64,
    *,
    bs: int = 16,
    budget: int = 2048,
    prefix_cache: bool = True,
    prefix_block_tokens: int = 32,
) -> EngineConfig:
    return EngineConfig(
        gpu_kv_blocks=gpu,
        cpu_kv_blocks=cpu,
        block_bytes=BLOCK_BYTES,
        block_size_tokens=bs,
        max_batched_tokens=budget,
        prefix_cache=prefix_cache,
        prefix_block_tokens=prefix_block_tokens,
    )


def check_cache(e: Engine) -> None:
    """The pool holds each cached block once: private blocks, cached blocks
    some request holds, and free blocks (never used, queued private runs,
    cached blocks nobody holds) add up to the pool; reference counts are the
    requests holding each block."""
    cache = e.prefix
    assert cache is not None
    s, r, pool = e.state, e.requests, e.config.gpu_kv_blocks
    cache._catch_up(s.free_gpu)
    assert 0 <= s.free_gpu <= pool
    holders: Counter[int] = Counter()
    private = 0
    for row, held in enumerate(cache.held):
        assert len(set(held)) == len(held), "a request holds a block twice"
        holders.update(held)
        own = int(r.gpu_blocks[row]) - len(held)
        assert own >= 0
        private += own
        if held:
            assert r.phase[row] in (Phase.RUNNING, Phase.IN_TRANSIT)
    assert all(count >= 0 for count in cache.refs.values())
    for key, count in cache.refs.items():
        assert count == holders[key], "a reference count is not its holders"
    assert set(holders) <= set(cache.refs)
    held_once = sum(1 for count in cache.refs.values() if count > 0)
    assert private + held_once + s.free_gpu == pool
    queued_cached = {key for key in cache.queue if key >= 0}
    assert queued_cached == {key for key, count in cache.refs.items() if count == 0}
    queued = sum(size for key, size in cache.queue.items())
    assert cache.never_used + queued == s.free_gpu
    assert all(size > 0 for size in cache.queue.values())
    assert int(r.cpu_blocks.sum()) == e.config.cpu_kv_blocks - s.free_cpu


class CacheCheckedEngine(Engine):
    checks = 0

    def _iteration(self) -> None:
        super()._iteration()
        check_cache(self)
        self.checks += 1

    def _quiet_stretch(self, progress: Callable[[float], None] | None) -> bool:
        if not super()._quiet_stretch(progress):
            return False
        check_cache(self)
        return True


def simulate(
    trace: Sequence[TraceRequest], cfg: EngineConfig, policy: str = "fcfs"
) -> tuple[Engine, ReplayResult]:
    engine_type = CacheCheckedEngine if cfg.prefix_cache else Engine
    scheduler = make_scheduler(policy, rotation_inputs())
    engine = engine_type(cfg, scheduler, AffineCost(), Link(), trace)
    return engine, engine.run()


# -- two requests sharing a prefix, by hand ---------------------------------------


def two_sharing(prefix_cache: bool) -> ReplayResult:
    # 64-token prompts, both prefix ids [1, 2] (32 tokens each): four full
    # blocks of 16, all cacheable. A prefills alone (10 + 64 ms); B comes
    # during it.
    trace = [req(0.0, 64, 10, [1, 2], "a"), req(0.05, 64, 10, [1, 2], "b")]
    _, result = simulate(trace, config(gpu=20, prefix_cache=prefix_cache))
    return result


def test_a_shared_prefix_is_held_once_and_not_prefilled_again() -> None:
    result = two_sharing(prefix_cache=True)
    a, b = result.requests
    assert a.token_times_s[0] == pytest.approx(0.074)
    # B finds 48 tokens cached (at most the prompt less one token hits, in
    # full blocks): it prefills 16 tokens beside A's decode, 10 + 16 + 2 ms.
    assert (a.cached_tokens, b.cached_tokens) == (0, 48)
    assert b.token_times_s[0] == pytest.approx(0.074 + 0.028)
    # That iteration holds A's 5 blocks (4 of prompt, 1 grown for its decode)
    # and B's own last block: its first 3 are A's.
    assert result.timeline[1].gpu_kv_blocks_used == 6
    assert result.totals.prefix_hit_tokens == 48
    assert result.totals.prefix_queried_tokens == 128


def test_without_the_cache_the_shared_prefix_is_prefilled_and_held_twice() -> None:
    result = two_sharing(prefix_cache=False)
    a, b = result.requests
    assert (a.cached_tokens, b.cached_tokens) == (0, 0)
    assert b.token_times_s[0] == pytest.approx(0.074 + 0.010 + 0.064 + 0.002)
    assert result.timeline[1].gpu_kv_blocks_used == 9
    assert result.totals.prefix_queried_tokens == 0


def test_a_request_after_the_first_finished_hits_its_freed_blocks() -> None:
    trace = [req(0.0, 64, 2, [1, 2]), req(1.0, 64, 2, [1, 2]), req(2.0, 64, 2, [1, 3])]
    _, result = simulate(trace, config(gpu=20))
    # The third shares only the first prefix block (32 tokens).
    assert [o.cached_tokens for o in result.requests] == [0, 48, 32]


# -- eviction order ----------------------------------------------------------------


def cache_of(prefix_ids: Sequence[Sequence[int]], prompts: Sequence[int], pool: int) -> PrefixCache:
    return PrefixCache(prefix_ids, np.array(prompts, dtype=np.int64), pool, 16, 16)


def test_eviction_takes_never_used_blocks_then_the_least_recently_freed() -> None:
    # Prompts of 33 tokens, one prefix id per 16 tokens: blocks 0 and 1 are
    # cacheable, the third (one token) is not.
    cache = cache_of([[1, 2, 3], [7, 8, 9], [1, 2, 4]], [33, 33, 33], pool=8)
    a0, a1 = cache.key(0, 0), cache.key(0, 1)
    b0, b1 = cache.key(1, 0), cache.key(1, 1)
    free = 8
    for row in (0, 1):
        hits, shared = cache.start(row, 33, 33, free)
        assert (hits, shared) == (0, 0)
        free -= 3
        cache.computed(row, 33)
        free += cache.release(row, 3, free)
    assert free == 8 and cache.never_used == 2
    # Freed: A's private block, then A's blocks last first, then B's.
    assert list(cache.queue.values()) == [1, 1, 1, 1, 1, 1]
    assert [k for k in cache.queue if k >= 0] == [a1, a0, b1, b0]
    # Four new blocks: two never used, A's private one, then A's block 1.
    cache._catch_up(free - 4)
    assert set(cache.refs) == {a0, b0, b1}
    assert cache.evictions == 1
    free -= 4
    # C shares A's first prefix block only: one hit.
    assert cache.start_cost(2, 3, 33, free) == (3, 16)
    hits, shared = cache.start(2, 33, 33, free)
    assert (hits, shared) == (1, 0)
    # The hit left the free queue: it is in use again.
    assert a0 not in cache.queue and cache.refs[a0] == 1


def test_a_hit_on_a_freed_block_makes_it_the_most_recently_freed_again() -> None:
    # A and B run one after the other, then C shares A's blocks: A's are now
    # freed after B's, and B's go first.
    cache = cache_of([[1, 2], [5, 6], [1, 2]], [33, 33, 33], pool=6)
    free = 6
    for row in (0, 1, 2):
        hits, shared = cache.start(row, 33, 33, free)
        assert (hits, shared) == ((2, 0) if row == 2 else (0, 0))
        free -= 3 - shared
        cache.computed(row, 33)
        free += cache.release(row, 3, free)
    assert free == 6 and cache.never_used == 0
    cache._catch_up(2)
    assert set(cache.refs) == {cache.key(0, 0), cache.key(0, 1)}
    assert cache.evictions == 2


def test_the_engine_cannot_free_blocks_behind_the_caches_back() -> None:
    cache = cache_of([[1]], [16], pool=4)
    with pytest.raises(PrefixCacheError, match="without releasing"):
        cache._catch_up(5)


# -- swaps and recomputes with shared blocks ----------------------------------------


POOL = 8


def shared_state() -> tuple[EngineState, PrefixCache]:
    """A (row 0) and B (row 1) prefilled, both prompts 64 tokens with prefix
    ids [1, 2] of 32 tokens: B holds A's first three blocks and its own
    fourth (the prompt less one token hits). C (row 2, 96 tokens, no prefix
    ids) waits."""
    trace = [req(0.0, 64, 8, [1, 2]), req(0.0, 64, 8, [1, 2]), req(0.0, 96, 1, [])]
    columns = RequestColumns.from_trace(trace, Slo())
    cache = PrefixCache([t.prefix_block_ids for t in trace], columns.prompt_tokens, POOL, 16, 32)
    s = EngineState(columns, POOL, 20, 16, prefix=cache)
    s.arrive(np.array([0, 1, 2]), np.array([], dtype=np.int64))
    for row in (0, 1):
        s.admit([row], [4], 0.0)
        columns.kv_tokens[row] = 64
        cache.computed(row, 64)
    return s, cache


def test_a_swapped_out_request_releases_its_references_and_shared_blocks_stay() -> None:
    s, cache = shared_state()
    r = s.requests
    assert r.kv_tokens.tolist() == [64, 64, 0]
    assert s.free_gpu == POOL - 5
    copied = s.preempt([1], swap=True)
    # B's whole KV goes to CPU; only its own block comes back to the pool,
    # the three it shares stay held by A.
    assert copied == 4 and r.cpu_blocks[1] == 4
    assert s.free_gpu == POOL - 4
    assert [cache.refs[cache.key(0, j)] for j in range(4)] == [1, 1, 1, 1]
    assert cache.held[1] == []


def test_a_resume_reuses_the_blocks_still_cached_and_copies_in_the_rest() -> None:
    s, cache = shared_state()
    r = s.requests
    s.preempt([1], swap=True)
    # A finishes: its blocks stay cached, free, its last first.
    r.generated[0] = r.output_tokens[0] - 1
    s.emit(np.array([0]), 1.0)
    assert s.free_gpu == POOL and cache.never_used == POOL - 5
    # C takes 6 blocks: the 3 never used, B's own block (freed at its
    # swap-out), then A's blocks 3 and 2; it finishes and frees them.
    s.admit([2], [6], 1.0)
    cache._catch_up(s.free_gpu)
    assert cache.evictions == 2
    assert set(cache.refs) == {cache.key(0, 0), cache.key(0, 1)}
    s.emit(np.array([2]), 1.1)
    assert s.free_gpu == POOL
    need = blocks_needed_one(64, 64, 16)
    assert s.start_cost(1, need, Phase.ROTARY) == (need, 0)
    free = s.free_gpu
    copied_in = s.swap_in([1], [need], keep_cpu_copies=False)
    # Blocks 0 and 1 reused in place, 2 and 3 copied from CPU (and cached
    # again), one more for the next decode.
    assert copied_in == 2
    assert s.free_gpu == free - need == POOL - 5
    assert [cache.refs[cache.key(1, j)] for j in range(4)] == [1, 1, 1, 1]
    assert cache.reused_on_resume == 2


def test_a_resume_beside_the_sharer_costs_only_its_own_blocks() -> None:
    s, cache = shared_state()
    s.preempt([1], swap=True)
    need = blocks_needed_one(64, 64, 16)
    # A still holds all four blocks of B's prompt: B takes only the fifth.
    assert s.start_cost(1, need, Phase.ROTARY) == (1, 0)
    free = s.free_gpu
    assert s.swap_in([1], [need], keep_cpu_copies=False) == 0
    assert s.free_gpu == free - 1
    assert [cache.refs[cache.key(0, j)] for j in range(4)] == [2, 2, 2, 2]


def test_a_recomputed_request_hits_what_is_still_cached() -> None:
    s, cache = shared_state()
    r = s.requests
    s.preempt([1], swap=False)
    assert r.phase[1] == Phase.QUEUED and r.kv_tokens[1] == 0
    assert s.free_gpu == POOL - 4
    assert s.start_cost(1, 4, Phase.QUEUED) == (1, 48)
    s.admit([1], [4], 1.0)
    assert r.kv_tokens[1] == 48
    assert s.free_gpu == POOL - 5
    # Its first start's hit is the one reported.
    assert cache.first_hit_tokens[1] == 48 and cache.hit_tokens == 48


def test_a_start_is_costed_after_the_blocks_the_one_before_it_took() -> None:
    # Pool 16, one prefix id per block. S (17 tokens, ids [1, ..]), R (33,
    # [1, 2, ..]) and T (64, none) prefill together: S caches block x0, R
    # keeps its copy of x0 private and caches x1. S and T finish at once
    # (one output token): free are 7 never used blocks, then S's private
    # block, x0, T's 4 blocks. A (144 tokens, 9 blocks, nothing cached) and
    # B (80 tokens, 5 blocks, prefix x0 x1) come next, A first. Costed
    # before A took its 9 blocks, B would cost 4 of the 4 left (x1 shared
    # with R); but A's blocks evict x0, so B finds nothing cached and needs
    # 5: it waits for A's, and prefills all 80 tokens.
    trace = [
        req(0.0, 17, 1, [1, 50], "s"),
        req(0.0, 33, 10, [1, 2, 60], "r"),
        req(0.0, 64, 1, [], "t"),
        req(0.01, 144, 2, [], "a"),
        req(0.01, 80, 2, [1, 2, 70, 71, 72], "b"),
    ]
    engine, result = simulate(trace, config(gpu=16, prefix_block_tokens=16))
    assert engine.checks > 0
    second = result.timeline[1]
    assert (second.running, second.waiting, second.gpu_kv_blocks_used) == (2, 1, 12)
    assert [s.prefill_tokens for s in result.timeline[:4]] == [114, 144, 0, 80]
    _, _, _, a, b = result.requests
    assert a.token_times_s == pytest.approx([0.280, 0.294], abs=1e-12)
    assert b.token_times_s == pytest.approx([0.386, 0.400], abs=1e-12)
    assert [o.cached_tokens for o in result.requests] == [0, 0, 0, 0, 0]
    assert engine.prefix is not None and engine.prefix.evictions == 1


# -- invariants on random traces ------------------------------------------------------


def sharing_trace(seed: int, n: int, with_ids: bool = True) -> list[TraceRequest]:
    """n requests whose prompts (16..128 tokens, one prefix id per 32) begin
    with one of a few shared prefixes of 1-3 ids, then their own ids."""
    rng = random.Random(seed)
    roots = [[rng.randrange(4) for _ in range(rng.randint(1, 3))] for _ in range(4)]
    t = 0.0
    trace = []
    fresh = 100
    for i in range(n):
        t += rng.expovariate(40.0)
        prompt = rng.randint(16, 128)
        blocks = -(-prompt // 32)
        ids = list(rng.choice(roots))[:blocks]
        while len(ids) < blocks:
            ids.append(fresh)
            fresh += 1
        trace.append(
            req(round(t, 4), prompt, rng.randint(1, 40), ids if with_ids else (), id=f"q{i}")
        )
    return trace


def outcomes(result: ReplayResult) -> list[tuple[object, ...]]:
    return [
        (o.id, tuple(o.token_times_s), o.finish_s, o.preemptions, o.swap_outs, o.swap_ins)
        for o in result.requests
    ]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    gpu=st.integers(12, 40),
    cpu=st.integers(0, 30),
    policy=st.sampled_from(POLICY_NAMES),
)
# Several requests admitted in one iteration, the first's blocks evicting
# the head of a later one's cached prefix.
@example(seed=9, gpu=37, cpu=1, policy="cfs")
# An iteration whose only move is a swap-out, the swap-in deferred to the
# next one.
@example(seed=0, gpu=12, cpu=13, policy="lvf-paper")
def test_reference_counts_and_the_pool_hold_under_every_policy(
    seed: int, gpu: int, cpu: int, policy: str
) -> None:
    trace = sharing_trace(seed, 25)
    engine, result = simulate(trace, config(gpu=gpu, cpu=cpu, budget=64), policy)
    assert isinstance(engine, CacheCheckedEngine) and engine.checks > 0
    assert all(0 <= s.gpu_kv_blocks_used <= gpu for s in result.timeline)
    assert result.totals.peak_gpu_kv_blocks <= gpu
    finished = [o for o in result.requests if o.finish_s is not None]
    assert len(finished) == len(trace)
    for o, t in zip(result.requests, trace, strict=True):
        assert len(o.token_times_s) == t.output_tokens
        assert 0 <= o.cached_tokens < t.prompt_tokens and o.cached_tokens % 16 == 0
    # Everything is released at the end: what stays cached is free.
    cache = engine.prefix
    assert cache is not None and all(count == 0 for count in cache.refs.values())
    assert engine.state.free_gpu == gpu


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    gpu=st.integers(12, 40),
    policy=st.sampled_from(POLICY_NAMES),
)
def test_the_cache_off_ignores_the_ids_and_on_without_ids_changes_nothing(
    seed: int, gpu: int, policy: str
) -> None:
    with_ids = sharing_trace(seed, 20)
    without = sharing_trace(seed, 20, with_ids=False)
    cfg = config(gpu=gpu, cpu=12, budget=64, prefix_cache=False)
    _, plain = simulate(without, cfg, policy)
    _, off = simulate(with_ids, cfg, policy)
    _, on_nothing_shared = simulate(without, dataclasses.replace(cfg, prefix_cache=True), policy)
    assert outcomes(off) == outcomes(plain) == outcomes(on_nothing_shared)
    assert off.timeline == plain.timeline == on_nothing_shared.timeline
    assert all(o.cached_tokens == 0 for o in off.requests)


def test_sharing_saves_prefill_on_a_sharing_trace() -> None:
    trace = sharing_trace(5, 60)
    _, off = simulate(trace, config(gpu=400, budget=64, prefix_cache=False))
    _, on = simulate(trace, config(gpu=400, budget=64))
    assert off.totals.preemptions == on.totals.preemptions == 0
    prefilled_off = sum(s.prefill_tokens for s in off.timeline)
    prefilled_on = sum(s.prefill_tokens for s in on.timeline)
    hits = sum(o.cached_tokens for o in on.requests)
    assert hits > 0
    assert prefilled_on == prefilled_off - hits
    assert on.totals.prefix_hit_tokens == hits


# -- the command -------------------------------------------------------------------------


def write_trace(path: Path, trace: Sequence[TraceRequest]) -> None:
    rows = [
        {
            "arrival_s": t.arrival_s,
            "prompt_tokens": t.prompt_tokens,
            "output_tokens": t.output_tokens,
            "id": t.id,
            "prefix_block_ids": list(t.prefix_block_ids),
        }
        for t in trace
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def test_replay_reports_the_hit_rate_and_each_requests_cached_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = [
        req(0.0, 1100, 4, [1, 2, 3], "a"),
        req(2.0, 1100, 4, [1, 2, 3], "b"),
        req(4.0, 600, 4, [1, 9], "c"),
    ]
    path = tmp_path / "t.jsonl"
    write_trace(path, trace)
    for mode in ("on", "off"):
        code = main(
            [
                "replay",
                str(path),
                "--quiet",
                "--policy",
                "fcfs",
                "--prefix-cache",
                mode,
                "--json-out",
                str(tmp_path / f"{mode}.json"),
                "--requests-out",
                str(tmp_path / f"{mode}.csv"),
            ]
        )
        out, err = capsys.readouterr()
        assert code == 0, err
        assert "Prefix-cache hit rate" in out
    on = pd.read_csv(tmp_path / "on.csv")
    # b: its whole prompt but the last partial block (1088 of 1100 tokens);
    # c: the first prefix block (512 tokens).
    assert on.cached_tokens.tolist() == [0, 1088, 512]
    summary = json.loads((tmp_path / "on.json").read_text())["policies"][0]
    assert summary["metrics"]["prefix_hit_rate"] == pytest.approx((1088 + 512) / 2800)
    assert summary["config"]["prefix_cache"] is True
    off = pd.read_csv(tmp_path / "off.csv")
    assert off.cached_tokens.tolist() == [0, 0, 0]
    off_summary = json.loads((tmp_path / "off.json").read_text())["policies"][0]
    assert off_summary["metrics"]["prefix_hit_rate"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prefix-cache", "on", "--topology", "cluster"], "--prefix-cache applies to"),
        (["--prefix-block-tokens", "0"], "--prefix-block-tokens must be >= 1"),
    ],
)
def test_bad_prefix_cache_options_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    path = tmp_path / "t.jsonl"
    write_trace(path, [req(0.0, 100, 4, [1])])
    assert main(["replay", str(path), "--quiet", *args]) == 2
    assert message in capsys.readouterr().err


def test_the_python_api_takes_the_prefix_cache_knob() -> None:
    trace = [req(0.0, 1100, 4, [1, 2, 3], "a"), req(2.0, 1100, 4, [1, 2, 3], "b")]
    runs = replay(trace, policies=["fcfs"], prefix_cache="on")
    assert runs.requests.cached_tokens.tolist() == [0, 1088]
    assert runs.summary["prefix_hit_rate"].tolist() == [pytest.approx(1088 / 2200)]
