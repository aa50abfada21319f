"""AQUA's completely fair batch partitioning (DESIGN.md §3.4, paper §7).

A token budget b per iteration is split into d decode slots (one token each)
and p prefill tokens. d is set to its upper bound: the most requests whose KV
fits in GPU memory (the decodes with the fewest generated tokens, smallest
first, as many as fit — that count). Decode slots go to the decodes with the
fewest generated tokens, prefill tokens to the prompts with the least prefill
progress (chunked: each takes what is left of its prompt or of p); decode
slots left unused go to prefill. Filling stops when GPU memory is exhausted.
Everything resident but not chosen is paged out, everything chosen but not
resident is paged in. The partition holds for k iterations or until a
request completes (`should_reschedule`).

Ties break by arrival, then id, so the plan is deterministic.
"""

from __future__ import annotations

from planner.domain.placement import CfsInputs, CfsPlan, CfsRequest


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def kv_blocks(r: CfsRequest, block_size: int, extra_tokens: int = 0) -> int:
    return _blocks(r.prefilled_tokens + r.generated_tokens + extra_tokens, block_size)


def partition_batch(inputs: CfsInputs) -> CfsPlan:
    bs = inputs.block_size
    decodes = sorted(
        (r for r in inputs.requests if r.decoding),
        key=lambda r: (r.generated_tokens, r.arrival_s, r.id),
    )
    prefills = sorted(
        (r for r in inputs.requests if not r.decoding),
        key=lambda r: (r.prefilled_tokens, r.arrival_s, r.id),
    )
    # d's upper bound: decodes (fewest generated first) whose KV, one token
    # grown, fits in GPU memory together.
    used = 0
    slots = 0
    for r in decodes:
        need = kv_blocks(r, bs, 1)
        if used + need > inputs.gpu_blocks:
            break
        used += need
        slots += 1
    d = min(slots, inputs.token_budget)
    free = inputs.gpu_blocks
    chosen_decodes: list[CfsRequest] = []
    for r in decodes[:d]:
        need = kv_blocks(r, bs, 1)
        if need > free:
            break
        free -= need
        chosen_decodes.append(r)
    p_left = inputs.token_budget - len(chosen_decodes)
    chunks: list[tuple[CfsRequest, int]] = []
    for r in prefills:
        if p_left <= 0:
            break
        want = min(r.prompt_tokens - r.prefilled_tokens, p_left)
        # The largest chunk whose KV still fits.
        fit = free * bs - (r.prefilled_tokens + r.generated_tokens)
        take = min(want, fit)
        if take <= 0:
            break  # GPU memory exhausted
        free -= kv_blocks(r, bs, take)
        p_left -= take
        chunks.append((r, take))
    chosen = {r.id for r in chosen_decodes} | {r.id for r, _ in chunks}
    page_out = [r for r in inputs.requests if r.resident and r.id not in chosen]
    page_in = [r for r in (*chosen_decodes, *(c for c, _ in chunks)) if not r.resident]
    return CfsPlan(
        decode_ids=tuple(r.id for r in chosen_decodes),
        prefill_chunks=tuple((r.id, t) for r, t in chunks),
        page_out_ids=tuple(r.id for r in page_out),
        page_in_ids=tuple(r.id for r in page_in),
        page_out_blocks=sum(kv_blocks(r, bs) for r in page_out),
        page_in_blocks=sum(kv_blocks(r, bs) for r in page_in),
        decode_slots=d,
        prefill_tokens=sum(t for _, t in chunks),
        blocks_used=inputs.gpu_blocks - free,
        next_reschedule_iteration=inputs.iteration + max(1, inputs.reschedule_every),
    )


def should_reschedule(iteration: int, plan: CfsPlan | None, completed: bool) -> bool:
    """Re-partition every k iterations, or when a request completed."""
    return plan is None or completed or iteration >= plan.next_reschedule_iteration
