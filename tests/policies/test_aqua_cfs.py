"""CFS batch partitioning: decode slots at their memory bound, fewest
generated tokens first; prefill by least progress with the unused decode
slots; page-out/page-in lists; memory never exceeded; rescheduling."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.domain.placement import CfsInputs, CfsRequest
from planner.policies.aqua.cfs import kv_blocks, partition_batch, should_reschedule


def req(id_, prompt, prefilled, generated=0, resident=False, arrival=0.0):
    return CfsRequest(id_, prompt, prefilled, generated, resident, arrival)


def test_paper_figure_6_shape():
    # GPU holds 3 requests' KV: A, B decoding (A longer), C and D prompts just
    # arrived. D must not starve behind A: A (most generated) is paged out.
    requests = (
        req("A", 32, 32, generated=40, resident=True),
        req("B", 32, 32, generated=8, resident=True),
        req("C", 32, 0, arrival=1.0),
        req("D", 32, 0, arrival=1.0),
    )
    # 16-token blocks; 12 blocks: B needs 3 (41 tokens), A 5 (73 tokens).
    plan = partition_batch(CfsInputs(requests, token_budget=66, gpu_blocks=12, block_size=16))
    assert plan.decode_slots == 2  # B (3 blocks) + A (5 blocks) fit
    assert plan.decode_ids == ("B", "A")
    # 64 prefill tokens left, least progress first: C then D, 32 each... but
    # only 4 blocks are left: C takes 32 tokens (2 blocks), D 32 (2 blocks).
    assert plan.prefill_chunks == (("C", 32), ("D", 32))
    assert plan.blocks_used == 12
    assert plan.page_in_ids == ("C", "D") and plan.page_out_ids == ()

    tight = partition_batch(CfsInputs(requests, token_budget=66, gpu_blocks=9, block_size=16))
    assert tight.decode_ids == ("B", "A")
    # One block left: C gets a 16-token chunk, D nothing (memory exhausted).
    assert tight.prefill_chunks == (("C", 16),)


def test_unused_decode_slots_go_to_prefill_and_residents_page_out():
    requests = (
        req("old", 16, 16, generated=100, resident=True),
        req("new", 16, 16, generated=2, resident=False),
        req("p1", 100, 50, resident=True),
        req("p2", 100, 10, resident=False),
    )
    # Memory for only one decode (the fewest generated: new, 2 blocks).
    plan = partition_batch(CfsInputs(requests, token_budget=40, gpu_blocks=8, block_size=16))
    assert plan.decode_slots == 1 and plan.decode_ids == ("new",)
    # 39 tokens of prefill: p2 first (least progress): 39 tokens need 4 blocks
    # (49 tokens); p1 gets nothing (budget spent).
    assert plan.prefill_chunks == (("p2", 39),)
    assert set(plan.page_out_ids) == {"old", "p1"}
    assert set(plan.page_in_ids) == {"new", "p2"}
    assert plan.page_out_blocks == kv_blocks(requests[0], 16) + kv_blocks(requests[2], 16)


def test_reschedule_every_k_or_on_completion():
    plan = partition_batch(CfsInputs((req("a", 4, 4, 1),), 8, 10, reschedule_every=4, iteration=10))
    assert plan.next_reschedule_iteration == 14
    assert not should_reschedule(13, plan, completed=False)
    assert should_reschedule(13, plan, completed=True)
    assert should_reschedule(14, plan, completed=False)
    assert should_reschedule(0, None, completed=False)


REQ = st.builds(
    lambda prompt, frac, gen, resident: (prompt, min(prompt, int(prompt * frac)), gen, resident),
    st.integers(1, 200),
    st.sampled_from([0.0, 0.3, 1.0, 1.0]),
    st.integers(0, 100),
    st.booleans(),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(REQ, max_size=12), st.integers(1, 256), st.integers(0, 60))
def test_plan_fits_budget_and_memory(specs, budget, gpu_blocks):
    requests = tuple(
        req(f"r{i}", p, f, g if f >= p else 0, res) for i, (p, f, g, res) in enumerate(specs)
    )
    plan = partition_batch(CfsInputs(requests, budget, gpu_blocks, block_size=16))
    tokens = len(plan.decode_ids) + plan.prefill_tokens
    assert tokens <= budget
    assert plan.blocks_used <= gpu_blocks
    by_id = {r.id: r for r in requests}
    blocks = sum(kv_blocks(by_id[i], 16, 1) for i in plan.decode_ids) + sum(
        kv_blocks(by_id[i], 16, t) for i, t in plan.prefill_chunks
    )
    assert blocks == plan.blocks_used
    for i, t in plan.prefill_chunks:
        assert 0 < t <= by_id[i].prompt_tokens - by_id[i].prefilled_tokens
    chosen = set(plan.decode_ids) | {i for i, _ in plan.prefill_chunks}
    assert set(plan.page_in_ids) == {i for i in chosen if not by_id[i].resident}
    assert set(plan.page_out_ids) == {r.id for r in requests if r.resident and r.id not in chosen}
    # Fairness: a chosen decode never has more generated tokens than one left out.
    left = [r for r in requests if r.decoding and r.id not in chosen]
    if plan.decode_ids and left:
        assert max(by_id[i].generated_tokens for i in plan.decode_ids) <= min(
            r.generated_tokens for r in left
        )
