"""`planner bench service` on a tiny run (4 client processes, 1 s, a real
server): every call answered, every field written, and the baseline
comparison catches an injected regression. Speed is never asserted."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from planner.bench.service import failed
from planner.bench.service_load import (
    CodeStats,
    PhaseConfig,
    PhaseResult,
    RssSample,
    ServerLimits,
)
from planner.bench.service_report import ServiceReport, compare, markdown_section
from planner.cli import main

PHASE_FIELDS = {
    "config",
    "window_s",
    "calls",
    "ok_calls",
    "errors",
    "throughput_per_s",
    "codes",
    "late_starts",
    "over_deadline",
    "rss_kb",
    "probe_after",
    "startup_s",
}


def phase(name: str = "load", p50_ms: float = 2.0, window_s: float = 10.0) -> PhaseResult:
    """A hand-made result: 1,000 OK calls in window_s."""
    return PhaseResult(
        config=PhaseConfig(name, clients=4, rate_hz=25.0, duration_s=10.0, deadline_ms=500.0),
        window_s=window_s,
        codes={"OK": CodeStats(1000, p50_ms, 3 * p50_ms, 4 * p50_ms, 5 * p50_ms)},
        late_starts=0,
        over_deadline=0,
        rss=[RssSample(0.0, 100_000), RssSample(5.0, 101_000), RssSample(10.0, 101_500)],
        probe_after="OK",
        startup_s=1.0,
    )


def report(*phases: PhaseResult) -> ServiceReport:
    return ServiceReport("2026-11-22 00:00 UTC", "planner bench service", {}, list(phases))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], str]:
    """One real run against a baseline that is far better on every count."""
    folder = tmp_path_factory.mktemp("service")
    tiny = PhaseConfig(
        "load", clients=4, rate_hz=20.0, duration_s=1.0, deadline_ms=5000.0,
        limits=ServerLimits(8, 128),
    )  # fmt: skip
    better = report(replace(phase(p50_ms=0.001, window_s=0.001), config=tiny))
    (folder / "baseline.json").write_text(json.dumps(better.to_json()), encoding="utf-8")
    md = folder / "benchmarks.md"
    md.write_text("# Benchmarks\n\nkept text\n", encoding="utf-8")
    code = main(
        ["bench", "service", "--clients", "4", "--rate-hz", "20", "--duration-s", "1",
         "--deadline-ms", "5000",
         "--out", str(folder / "service.json"), "--markdown", str(md),
         "--baseline", str(folder / "baseline.json")]
    )  # fmt: skip
    doc = json.loads((folder / "service.json").read_text(encoding="utf-8"))
    return code, doc, md.read_text(encoding="utf-8")


def test_tiny_run_answers_every_call_and_writes_every_field(
    tiny_run: tuple[int, dict[str, Any], str],
) -> None:
    _, doc, _ = tiny_run
    assert doc["bench"] == "service"
    assert doc["command"].startswith("planner bench service --clients 4 --rate-hz 20")
    assert doc["machine"]["load_avg_1m_at_end"] is not None
    [load] = doc["phases"]
    assert set(load) == PHASE_FIELDS
    assert load["config"]["clients"] == 4
    assert load["errors"] == 0 and load["over_deadline"] == 0
    assert load["calls"] == load["ok_calls"] == load["codes"]["OK"]["calls"] > 0
    assert set(load["codes"]["OK"]) == {"calls", "p50_ms", "p99_ms", "p999_ms", "max_ms"}
    ok = load["codes"]["OK"]
    assert 0 < ok["p50_ms"] <= ok["p99_ms"] <= ok["p999_ms"] <= ok["max_ms"]
    assert load["probe_after"] == "OK"
    rss = load["rss_kb"]
    assert len(rss["samples"]) >= 2
    assert all(rss[k] > 0 for k in ("start", "middle", "end"))


def test_tiny_run_flags_the_injected_regression(
    tiny_run: tuple[int, dict[str, Any], str],
) -> None:
    code, doc, _ = tiny_run
    assert code == 1
    [case] = doc["baseline"]["cases"]
    assert case["phase"] == "load"
    assert case["regressed"] == ["p50", "throughput"]
    assert doc["baseline"]["regressions"] == 1


def test_tiny_run_writes_its_markdown_section_only(
    tiny_run: tuple[int, dict[str, Any], str],
) -> None:
    _, _, text = tiny_run
    assert text.startswith("# Benchmarks\n\nkept text\n")
    assert text.count("<!-- bench:service:load -->") == 1
    assert "## Service under load" in text
    assert "| load | 8 workers, 128 concurrent RPCs | 4 x 20 Hz | 5000 |" in text


def test_report_json_round_trip() -> None:
    original = report(phase(), phase("overload 1w 2c"))
    original.phases[1] = replace(
        original.phases[1],
        codes={**original.phases[1].codes, "RESOURCE_EXHAUSTED": CodeStats(7, 1, 2, 3, 4)},
        probe_after="UNAVAILABLE",
    )
    data = json.loads(json.dumps(original.to_json()))
    again = ServiceReport.from_json(data)
    assert again == original
    assert again.to_json() == data


def test_a_result_of_another_bench_is_no_baseline() -> None:
    with pytest.raises(ValueError, match="not a `planner bench service` result"):
        ServiceReport.from_json({"bench": "replay/speed"})


def test_compare_within_noise_flags_nothing() -> None:
    baseline = report(phase(p50_ms=2.0)).to_json()
    result = compare([phase(p50_ms=2.3, window_s=11.0)], baseline, factor=1.2)
    assert result["regressions"] == 0 and result["cases"][0]["regressed"] == []


def test_compare_flags_new_load_errors_and_a_failed_call_after() -> None:
    baseline = report(phase()).to_json()
    broken = replace(
        phase(),
        codes={**phase().codes, "DEADLINE_EXCEEDED": CodeStats(3, 500, 500, 500, 500)},
        probe_after="UNAVAILABLE",
    )
    result = compare([broken], baseline, factor=1.2)
    assert result["cases"][0]["regressed"] == ["errors", "probe"]


def test_compare_skips_phases_the_baseline_lacks_or_ran_otherwise() -> None:
    baseline = report(phase()).to_json()
    other_rate = replace(phase(), config=replace(phase().config, rate_hz=50.0))
    longer = replace(phase(), config=replace(phase().config, duration_s=30.0))
    result = compare([phase("overload 8w 8c"), other_rate, longer], baseline, factor=1.2)
    assert [c["phase"] for c in result["cases"]] == ["load"] and result["unmatched"] == 2


def test_failed_only_on_load_errors_failed_probe_or_regression() -> None:
    refused = replace(
        phase("overload 1w 2c"),
        codes={**phase().codes, "RESOURCE_EXHAUSTED": CodeStats(9, 1, 1, 1, 1)},
    )
    assert not failed(report(phase(), refused))
    load_error = replace(phase(), codes={**phase().codes, "UNAVAILABLE": CodeStats(1, 1, 1, 1, 1)})
    assert failed(report(load_error))
    assert failed(report(phase(), replace(refused, probe_after="DEADLINE_EXCEEDED")))


def test_markdown_section_states_the_memory_samples() -> None:
    text = markdown_section(report(phase()))
    assert "server RSS 98 MB at start, 99 MB in the middle, 99 MB at the end (3 samples" in text
    assert "| load | 8 workers, 64 concurrent RPCs | 4 x 25 Hz | 500 | 1,000 | 100 |" in text


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--clients", "0"], "--clients"),
        (["--rate-hz", "-1"], "--rate-hz"),
        (["--deadline-ms", "0"], "--deadline-ms"),
        (["--overload-limits", "8:0"], "--overload-limits"),
        (["--overload-limits", "eight"], "--overload-limits"),
    ],
)
def test_bad_options_exit_2_naming_the_field(
    argv: list[str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "service", *argv])
    assert exc.value.code == 2
    assert field in capsys.readouterr().err


def test_server_limits_label_and_arguments() -> None:
    limits = ServerLimits(2, 4)
    assert limits.label == "2 workers, 4 concurrent RPCs"
    assert limits.serve_args() == ("--max-workers", "2", "--max-concurrent-rpcs", "4")
