"""Producer-consumer matching within one server (AQUA, DESIGN.md §3.4): one
producer GPU per consumer GPU (sharing a producer would oversubscribe its
link), stable, by Gale-Shapley with consumers proposing (the
consumer-optimal stable matching).

Preferences:
- a consumer prefers producers that cover its whole demand, the tightest
  fit first (leaving larger producers to larger consumers), then producers
  that cover part of it, the most spare memory first;
- a producer prefers consumers it covers whole, the largest demand first
  (the most of its spare memory used), then consumers it covers in part, the
  smallest demand first (the largest covered fraction).
Ties break by id, so preferences are strict and the result deterministic.
Consumers left without a producer page to CPU DRAM.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from planner.domain.placement import MatchGpu, MatchPair, ServerMatching


def consumer_rank(c: MatchGpu, p: MatchGpu) -> tuple[int, int, str]:
    """Smaller is preferred."""
    if p.spare_bytes >= c.demand_bytes:
        return (0, p.spare_bytes, p.id)
    return (1, -p.spare_bytes, p.id)


def _consumer_key(c: MatchGpu, p: MatchGpu) -> tuple[int, int, str]:
    return consumer_rank(c, p)


def producer_rank(p: MatchGpu, c: MatchGpu) -> tuple[int, int, str]:
    if c.demand_bytes <= p.spare_bytes:
        return (0, -c.demand_bytes, c.id)
    return (1, c.demand_bytes, c.id)


def split_roles(gpus: Sequence[MatchGpu]) -> tuple[list[MatchGpu], list[MatchGpu]]:
    """(producers, consumers): spare_bytes > 0, demand_bytes > 0."""
    producers = [g for g in gpus if g.spare_bytes > 0]
    consumers = [g for g in gpus if g.demand_bytes > 0]
    return producers, consumers


def match_server(gpus: Sequence[MatchGpu]) -> ServerMatching:
    producers, consumers = split_roles(gpus)
    prefs: dict[str, list[MatchGpu]] = {}
    for c in consumers:
        prefs[c.id] = sorted(producers, key=functools.partial(_consumer_key, c))
    by_id = {g.id: g for g in gpus}
    next_choice = dict.fromkeys(prefs, 0)
    holder: dict[str, str] = {}  # producer id -> consumer id
    free = sorted(c.id for c in consumers)
    while free:
        cid = free.pop(0)
        choices = prefs[cid]
        if next_choice[cid] >= len(choices):
            continue  # rejected by every producer: DRAM
        p = choices[next_choice[cid]]
        next_choice[cid] += 1
        current = holder.get(p.id)
        if current is None:
            holder[p.id] = cid
        elif producer_rank(p, by_id[cid]) < producer_rank(p, by_id[current]):
            holder[p.id] = cid
            free.append(current)
        else:
            free.append(cid)
    pairs = []
    for pid, cid in sorted(holder.items(), key=lambda kv: kv[1]):
        p, c = by_id[pid], by_id[cid]
        covered = min(p.spare_bytes, c.demand_bytes)
        pairs.append(
            MatchPair(
                producer_id=pid,
                consumer_id=cid,
                covered_bytes=covered,
                dram_bytes=c.demand_bytes - covered,
                headroom_gbps=min(p.link_gbps, c.link_gbps) - c.paging_gbps,
            )
        )
    matched_c = set(holder.values())
    return ServerMatching(
        pairs=tuple(pairs),
        dram_consumers=tuple(sorted(c.id for c in consumers if c.id not in matched_c)),
        idle_producers=tuple(sorted(p.id for p in producers if p.id not in holder)),
    )


def blocking_pairs(gpus: Sequence[MatchGpu], matching: ServerMatching) -> list[tuple[str, str]]:
    """(producer, consumer) pairs that both prefer each other to their match
    (empty for a stable matching)."""
    producers, consumers = split_roles(gpus)
    of_c = {m.consumer_id: m.producer_id for m in matching.pairs}
    of_p = {m.producer_id: m.consumer_id for m in matching.pairs}
    by_id = {g.id: g for g in gpus}
    out = []
    for c in consumers:
        for p in producers:
            if of_c.get(c.id) == p.id:
                continue
            c_wants = c.id not in of_c or consumer_rank(c, p) < consumer_rank(c, by_id[of_c[c.id]])
            p_wants = p.id not in of_p or producer_rank(p, c) < producer_rank(p, by_id[of_p[p.id]])
            if c_wants and p_wants:
                out.append((p.id, c.id))
    return out
