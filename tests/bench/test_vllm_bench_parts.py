"""The vLLM bench's pieces that need no engine: the long-decodes load and
the decision-log summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.bench.decision_summary import summarize
from planner.bench.http_load import LongDecodesLoad
from planner.bench.vllm_paired import bootstrap_ci, compare, load_pairs, main, sign_test_p


def test_long_decodes_load_sends_the_long_requests_first():
    load = LongDecodesLoad(num_long=3, num_short=5, short_start_s=1.0, short_gap_s=0.5)
    requests = load.requests()
    assert [r.id for r in requests] == [
        "long-0", "long-1", "long-2", "short-0", "short-1", "short-2", "short-3", "short-4",
    ]  # fmt: skip
    assert [r.send_at_s for r in requests[3:]] == [1.0, 1.5, 2.0, 2.5, 3.0]
    assert all(440 <= r.max_tokens <= 520 for r in requests[:3])
    assert all(16 <= r.max_tokens <= 32 for r in requests[3:])
    long_words = [len(r.prompt.split()) for r in requests[:3]]
    assert all(280 <= n <= 320 for n in long_words)
    # Seeded: the same load every time.
    assert load.requests() == requests


def test_decision_summary_counts_what_plans_changed(tmp_path: Path):
    steps = [
        # vLLM's order kept: the plan would have put b first.
        {"applied": "engine-order", "engine_order": ["a", "b"], "prioritized": ["b"],
         "plan_preempted": [], "admitted": ["a"], "preempted": ["r1"]},
        # Applied with a preemption of r2; vLLM preempted r3 itself.
        {"applied": "applied", "engine_order": ["a", "b"], "prioritized": ["b", "a"],
         "plan_preempted": ["r2"], "admitted": ["b", "a"], "preempted": ["r2", "r3"]},
        {"applied": "no-victim", "engine_order": ["c"], "prioritized": None,
         "plan_preempted": None, "admitted": [], "preempted": []},
    ]  # fmt: skip
    log = tmp_path / "run.decisions.jsonl"
    log.write_text("".join(json.dumps(s) + "\n" for s in steps))
    summary = summarize(log)
    assert summary.steps == 3
    assert summary.by_outcome == {"engine-order": 1, "applied": 1, "no-victim": 1}
    assert summary.plan_preemptions == 1
    assert summary.engine_preemptions == 2
    assert (summary.jumps, summary.jumps_applied) == (2, 1)
    assert summary.admitted == 3


def test_paired_comparison_counts_signs_and_brackets_the_difference(tmp_path: Path):
    # Exact binomial: 9 of 10 one way is p = 2 * 11 / 1024.
    assert sign_test_p(9, 1) == 2 * 11 / 1024
    assert sign_test_p(5, 5) == 1.0
    assert sign_test_p(0, 0) == 1.0
    row = compare([0.80, 0.85, 0.90, 0.70], [0.82, 0.85, 0.95, 0.74], "both_attainment")
    assert (row.above, row.below, row.ties) == (3, 0, 1)
    assert abs(row.mean_diff - 0.0275) < 1e-12
    low, high = row.mean_diff_ci
    assert 0.0 <= low <= row.mean_diff <= high <= 0.05
    assert bootstrap_ci([1.0, 1.0, 1.0], "median") == (1.0, 1.0)
    for i, (a, b) in enumerate([(0.8, 0.9), (0.7, 0.6)]):
        runs = [{"config": "plain", "both_attainment": a}, {"config": "grpc", "both_attainment": b}]
        (tmp_path / f"pair{i}").mkdir()
        (tmp_path / f"pair{i}" / "results.json").write_text(json.dumps({"results": runs}))
    pairs = load_pairs([tmp_path / "pair0", tmp_path / "pair1"], "plain", "grpc")
    assert [(x["both_attainment"], y["both_attainment"]) for x, y in pairs] == [
        (0.8, 0.9),
        (0.7, 0.6),
    ]
    # A file without one run of each configuration is refused, naming it.
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "pair0"), "--a", "plain", "--b", "in-process"])
    assert exit_info.value.code == 2
