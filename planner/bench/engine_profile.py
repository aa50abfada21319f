"""`planner profile`: measure a running engine's costs and write the profile
`planner replay --profile MODEL@FILE.json` loads.

How it measures (recorded in the profile's provenance):

1. **Iterations, by synthetic batches over HTTP.** Probes of B identical-
   shape requests (prompt length, output tokens) are sent at once to the
   engine's OpenAI-compatible API, streamed, one probe at a time, in a
   shuffled order, repeated. Decode probes (B of 1 to 64, short and long
   prompts, few and many output tokens) pin down the per-iteration overhead,
   the per-decode-token cost and the attended-context cost; prefill probes
   (one output token, prompts up to the model's length) the per-prefill-token
   cost. Each prompt is unique (no prefix-cache hits).
2. **Fit through the replay engine.** Each probe is replayed by the same
   engine `planner replay` runs (planner.replay.engine, vLLM's FCFS
   scheduling, the engine's limits), which says which iterations each
   request's last token waited for and what each did; the measured time from
   the batch's first send to that token is then linear in the constants
   (planner.profiles.fit), fitted by relative non-negative least squares;
   the replay is run again with the fitted constants until they settle (the
   schedule barely depends on them).
3. **Block copies, in process.** Swaps copy a request's blocks layer by
   layer with the adapter's own copy (planner.kernels.transfer_ref:
   index_select + index_copy_) between the engine's KV layout and a CPU pool:
   timed here for 1 to 256 blocks in each direction, on this machine (the
   engine's, for a CPU engine).

A client-side latency (HTTP, tokenization, detokenization, streaming) is
fitted as well: the profile's ``request_latency_s``, which the replay adds to
every request's latencies.

4. **The spread of the engine's step times.** Around each probe the engine's
   own inter-token latency histogram (vLLM's, timed between the steps that
   emit a request's tokens) is read from its /metrics; in a decode probe
   whose prompts all prefill in its first step every later step decodes the
   same batch, so its inter-token latencies are that batch's step times. The
   ratio of their p99 to their p50, the median over such probes, gives the
   coefficient of variation of the lognormal with that ratio
   (``step_jitter_cv``, what ``planner replay --compute-jitter`` draws).
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from planner._version import __version__
from planner.bench.machine import cpu_model, load_average
from planner.bench.openai_stream import StreamRecord, StreamRequest, run_requests
from planner.bench.prometheus_histogram import (
    Buckets,
    bucket_count,
    bucket_quantile,
    buckets_between,
    read_histogram,
)
from planner.bench.tiny_llama import prompt_text
from planner.domain.requests import Slo
from planner.profiles.fit import (
    CostFit,
    FloatArray,
    LinearCost,
    RecordingCost,
    fit_costs,
)
from planner.profiles.hardware import HardwareProfile
from planner.profiles.link import GB, LinkModel, MeasuredCurve, MeasuredPoint
from planner.profiles.loading import MeasuredProfile
from planner.profiles.models import ModelProfile
from planner.replay.engine import Engine, EngineConfig
from planner.replay.models import IterationCost
from planner.replay.schedulers import Fcfs
from planner.trace.records import TraceRequest

PROFILE_TOOL = f"planner profile {__version__}"
# Fit rounds at most (each replays every probe).
FIT_ROUNDS = 6
# Constants that moved less than this (relative) have settled.
FIT_SETTLED = 0.01
# Block counts the copies are timed at.
COPY_BLOCKS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# The engine's own inter-token latency histogram (vLLM's), read around each
# probe; a decode probe tells the spread of its steps when it asked for at
# least JITTER_MIN_OUTPUT tokens and its histogram holds JITTER_MIN_GAPS.
STEP_GAP_METRIC = "vllm:inter_token_latency_seconds"
JITTER_MIN_OUTPUT = 32
JITTER_MIN_GAPS = 20
# The standard normal's 99th percentile.
Z_99 = 2.3263478740408408


@dataclass(frozen=True, slots=True)
class Probe:
    batch: int
    prompt_words: int
    output_tokens: int

    @property
    def name(self) -> str:
        return f"B{self.batch}-w{self.prompt_words}-o{self.output_tokens}"


# Decode probes: batch x prompt length x output length; prefill probes: one
# output token. The tiny model's prompt words are about 1.3 tokens each.
DECODE_PROBES = tuple(Probe(b, w, o) for b in (1, 8, 32, 64) for w in (16, 300) for o in (8, 96))
PREFILL_PROBES = tuple(Probe(b, w, 1) for b in (1, 4, 16) for w in (48, 300, 500))
QUICK_PROBES = (
    *(Probe(b, w, o) for b in (1, 16, 48) for w in (16, 300) for o in (8, 64)),
    *(Probe(b, w, 1) for b in (1, 8) for w in (48, 600)),
)
# A prompt word is at most this many tokens (for the KV check).
TOKENS_PER_WORD_MAX = 2.0


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """What the engine was started with (vLLM: --block-size,
    --num-gpu-blocks-override, --max-num-batched-tokens, --max-num-seqs,
    --max-model-len)."""

    block_size_tokens: int
    gpu_kv_blocks: int
    max_batched_tokens: int
    max_running: int
    max_model_len: int

    def fitted(self, probe: Probe) -> Probe | None:
        """The probe with its batch cut to what the engine holds at once (KV
        pool, running cap); None when one request exceeds the model length
        or the pool."""
        tokens = math.ceil(probe.prompt_words * TOKENS_PER_WORD_MAX) + probe.output_tokens
        blocks = -(-tokens // self.block_size_tokens)
        batch = min(probe.batch, self.max_running, self.gpu_kv_blocks // blocks)
        if tokens > self.max_model_len or batch < 1:
            return None
        return probe if batch == probe.batch else replace(probe, batch=batch)


@dataclass(slots=True)
class ProbeRun:
    probe: Probe
    repeat: int
    records: list[StreamRecord]
    load_average: float | None
    # The engine's inter-token latencies during the probe (STEP_GAP_METRIC's
    # cumulative buckets; empty where the engine serves none).
    step_gaps: Buckets = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CopyTiming:
    """Median seconds of one swap of `blocks` blocks (all layers) each way."""

    blocks: int
    block_bytes: int
    h2d_s: float
    d2h_s: float


@dataclass(slots=True)
class EngineProfile:
    """What `planner profile` measured and fitted."""

    fit: CostFit
    runs: list[ProbeRun]
    copies: list[CopyTiming]
    limits: EngineLimits
    url: str
    served_model: str
    rounds: int
    started: str
    wall_s: float
    load_average_before: float | None
    load_average_after: float | None
    failed_requests: int
    merged_chunks: int
    notes: list[str] = field(default_factory=list)

    @property
    def step_spread(self) -> StepSpread | None:
        return step_spread(self.runs, self.limits.max_batched_tokens)


def load_text(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1f}"


def probe_requests(probe: Probe, salt: int) -> list[StreamRequest]:
    """The probe's requests, all sent at once, each prompt its own text."""
    return [
        StreamRequest(
            id=f"{probe.name}-{i}",
            send_at_s=0.0,
            prompt=prompt_text(probe.prompt_words, salt + i),
            max_tokens=probe.output_tokens,
        )
        for i in range(probe.batch)
    ]


def run_probes(
    url: str,
    served_model: str,
    probes: Sequence[Probe],
    repeats: int,
    seed: int,
    *,
    pause_s: float = 0.2,
    progress: Any = None,
) -> list[ProbeRun]:
    """Every probe `repeats` times, one at a time, in a shuffled order per
    repeat. Prompts are salted by seed so that no two requests share a
    prefix, within this run or with an earlier one using another seed."""
    rng = random.Random(seed)
    runs: list[ProbeRun] = []
    salt = seed * 1_000_003
    for repeat in range(repeats):
        order = list(probes)
        rng.shuffle(order)
        for probe in order:
            requests = probe_requests(probe, salt)
            salt += probe.batch
            before = read_histogram(url, STEP_GAP_METRIC)
            records = run_requests(url, served_model, requests)
            gaps = buckets_between(read_histogram(url, STEP_GAP_METRIC), before)
            runs.append(ProbeRun(probe, repeat, records, load_average(), gaps))
            if progress is not None:
                progress(len(runs), repeats * len(probes), probe)
            time.sleep(pause_s)
    return runs


# --- the spread of the step times ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepSpread:
    """The p99 / p50 ratio of the engine's inter-token latencies in each
    decode probe that shows one batch's steps, and the lognormal's
    coefficient of variation with their median ratio."""

    ratios: list[float]

    @property
    def ratio(self) -> float:
        return float(np.median(self.ratios))

    @property
    def cv(self) -> float:
        sigma = math.log(max(self.ratio, 1.0)) / Z_99
        return math.sqrt(math.expm1(sigma * sigma))


def step_spread(runs: Sequence[ProbeRun], max_batched_tokens: int) -> StepSpread | None:
    """The spread of the steps of the decode probes whose prompts all prefill
    in their first step (every later step decodes the whole batch): None
    when no probe shows it (the engine serves no histogram)."""
    ratios = []
    for run in runs:
        prompts = sum(int(r.prompt_tokens or 0) for r in run.records)
        if (
            run.probe.output_tokens < JITTER_MIN_OUTPUT
            or prompts > max_batched_tokens
            or not all(r.done for r in run.records)
            or bucket_count(run.step_gaps) < JITTER_MIN_GAPS
        ):
            continue
        p50 = bucket_quantile(run.step_gaps, 0.5)
        p99 = bucket_quantile(run.step_gaps, 0.99)
        if p50 is not None and p99 is not None and p50 > 0:
            ratios.append(p99 / p50)
    return StepSpread(ratios) if ratios else None


# --- fitting through the replay engine -------------------------------------------


@dataclass(frozen=True, slots=True)
class ProbeRows:
    """A probe run's observation: (iterations, sum P, sum D, sum A, sum S)
    and the measured seconds (none when no request finished)."""

    rows: list[tuple[float, float, float, float, float]]
    measured_s: list[float]


def probe_trace(records: Sequence[StreamRecord]) -> tuple[list[TraceRequest], float]:
    """The probe as a trace (arrivals = when each request was sent, from the
    first) and the first send time."""
    t0 = min(r.sent_s for r in records)
    return [
        TraceRequest(
            arrival_s=r.sent_s - t0,
            prompt_tokens=int(r.prompt_tokens or 1),
            output_tokens=r.max_tokens,
            id=r.id,
        )
        for r in records
    ], t0


def probe_engine(
    trace: Sequence[TraceRequest],
    cost: LinearCost,
    limits: EngineLimits,
    timer: IterationCost | None = None,
) -> Engine:
    """The replay of a probe's trace: FCFS within the engine's limits, KV on
    the GPU only, each iteration timed by cost (or timer, a wrapper of it)."""
    return Engine(
        EngineConfig(
            gpu_kv_blocks=limits.gpu_kv_blocks,
            cpu_kv_blocks=0,
            block_bytes=1,
            block_size_tokens=limits.block_size_tokens,
            max_batched_tokens=limits.max_batched_tokens,
            max_running=limits.max_running,
            slo=Slo(),
            prefill_s_per_sequence=cost.prefill_s_per_sequence,
        ),
        Fcfs(),
        cost if timer is None else timer,
        LinkModel.flat(1.0, 1.0, full_duplex=True),
        trace,
    )


def probe_rows(
    records: Sequence[StreamRecord], cost: LinearCost, limits: EngineLimits
) -> ProbeRows:
    """Replays one probe run with cost; for each request that finished, the
    (iterations, sum P, sum D, sum A, sum S) of the iterations from the start of
    the engine's busy stretch to its last token, and the measured time of
    that token from the stretch's start; averaged over the batch."""
    done = [r for r in records if r.done and r.finish_s is not None and r.prompt_tokens]
    if not done:
        return ProbeRows([], [])
    trace, t0 = probe_trace(done)
    recording = RecordingCost(cost)
    result = probe_engine(trace, cost, limits, recording).run()
    timeline = result.timeline
    features = np.asarray(recording.iterations, dtype=np.float64).reshape(-1, 3)
    if len(features) != len(timeline):
        raise RuntimeError("the replay engine timed an iteration it did not record")
    ends = np.array([s.time_s for s in timeline])
    starts = ends - np.array([s.iteration_s for s in timeline])
    # A busy stretch starts where an iteration does not follow the last one.
    new_stretch = np.ones(len(ends), dtype=bool)
    new_stretch[1:] = np.abs(starts[1:] - ends[:-1]) > 1e-12
    stretch = np.cumsum(new_stretch) - 1
    stretch_start = starts[new_stretch][stretch]
    counts = np.ones(len(ends))
    sequences = np.array([s.prefill_sequences for s in timeline], dtype=np.float64)
    cumulative = np.column_stack((counts, features, sequences))
    # Cumulative sums restarting at each stretch.
    totals = np.cumsum(cumulative, axis=0)
    before = np.vstack((np.zeros((1, cumulative.shape[1])), totals[:-1]))[new_stretch][stretch]
    within = totals - before
    rows: list[FloatArray] = []
    measured: list[float] = []
    for outcome, record in zip(result.requests, done, strict=True):
        if outcome.finish_s is None or record.finish_s is None:
            continue
        k = int(np.searchsorted(ends, outcome.finish_s - 1e-12))
        elapsed = record.finish_s - (stretch_start[k] + t0)
        if elapsed <= 0:
            continue
        rows.append(within[k])
        measured.append(elapsed)
    if not rows:
        return ProbeRows([], [])
    # The requests of one batch share most of their iterations: their times
    # are one observation, not B. Their mean (the equations are linear) is
    # the batch's row.
    mean = np.mean(rows, axis=0)
    return ProbeRows([(mean[0], mean[1], mean[2], mean[3], mean[4])], [float(np.mean(measured))])


def fit_probes(
    runs: Sequence[ProbeRun], limits: EngineLimits, start: LinearCost | None = None
) -> tuple[CostFit, int]:
    """Fits the linear cost model to every probe run (module docstring, 2);
    returns the fit and the rounds it took."""
    cost = start or LinearCost(5e-3, 2e-5, 1e-4, 1e-7, 1e-4)
    fit: CostFit | None = None
    for rounds in range(1, FIT_ROUNDS + 1):
        rows: list[tuple[float, float, float, float, float]] = []
        measured: list[float] = []
        for run in runs:
            part = probe_rows(run.records, cost, limits)
            rows += part.rows
            measured += part.measured_s
        fit = fit_costs(rows, measured)
        settled = _settled(cost, fit.cost)
        cost = fit.cost
        if settled:
            return fit, rounds
    assert fit is not None
    return fit, FIT_ROUNDS


def _settled(old: LinearCost, new: LinearCost) -> bool:
    for a, b in zip(old.constants().values(), new.constants().values(), strict=True):
        scale = max(abs(a), abs(b))
        if scale > 0 and abs(a - b) / scale > FIT_SETTLED:
            return False
    return True


# --- block copies ----------------------------------------------------------------


def time_copies(
    model: ModelProfile,
    block_size_tokens: int,
    blocks: Sequence[int] = COPY_BLOCKS,
    repeats: int = 7,
    seed: int = 0,
) -> list[CopyTiming]:
    """Median time of swapping n blocks out and in, every layer, with the
    adapter's copy, between a KV cache laid out as vLLM's CPU backend lays it
    out ((2, blocks, KV heads, block tokens, head dim) per layer, read
    block-major) and a block-major CPU pool (as PlannerSwapConnector
    allocates it)."""
    import torch  # noqa: PLC0415 - torch is optional (the kernels extra)

    from planner.kernels.transfer_ref import (  # noqa: PLC0415 - it imports torch
        copy_blocks_reference,
    )

    dtype = {2: torch.bfloat16, 4: torch.float32}.get(model.kv_dtype_bytes, torch.float16)
    pool = max(2 * max(blocks), 64)
    layers = []
    for _ in range(model.num_layers):
        cache = torch.zeros(
            (2, pool, model.num_kv_heads, block_size_tokens, model.head_dim), dtype=dtype
        )
        gpu = cache.movedim(1, 0)
        cpu = torch.zeros((pool, *gpu.shape[1:]), dtype=dtype)
        layers.append((gpu, cpu))
    block_bytes = (
        2 * model.num_layers * model.num_kv_heads * block_size_tokens * model.head_dim
    ) * model.kv_dtype_bytes
    generator = torch.Generator().manual_seed(seed)
    out: list[CopyTiming] = []
    for n in blocks:
        samples: dict[str, list[float]] = {"h2d": [], "d2h": []}
        for _ in range(repeats):
            src = torch.randperm(pool, generator=generator)[:n]
            dst = torch.randperm(pool, generator=generator)[:n]
            started = time.perf_counter()
            for gpu, cpu in layers:
                copy_blocks_reference(gpu, cpu, src, dst)
            samples["d2h"].append(time.perf_counter() - started)
            started = time.perf_counter()
            for gpu, cpu in layers:
                copy_blocks_reference(cpu, gpu, dst, src)
            samples["h2d"].append(time.perf_counter() - started)
        out.append(
            CopyTiming(
                blocks=n,
                block_bytes=block_bytes,
                h2d_s=float(np.median(samples["h2d"])),
                d2h_s=float(np.median(samples["d2h"])),
            )
        )
    return out


def copy_link(copies: Sequence[CopyTiming], name: str) -> LinkModel:
    """The measured copies as a link: one point per size and direction; the
    two directions run one after the other in the worker (not full duplex)."""

    def curve(direction: str) -> MeasuredCurve:
        points = []
        for c in copies:
            seconds = c.h2d_s if direction == "h2d" else c.d2h_s
            size = c.blocks * c.block_bytes
            points.append(MeasuredPoint(size, size / max(seconds, 1e-9) / GB))
        return MeasuredCurve(tuple(points))

    return LinkModel(name=name, h2d=curve("h2d"), d2h=curve("d2h"), full_duplex=False)


# --- the profile -----------------------------------------------------------------


def model_from_config(config: dict[str, Any], name: str) -> ModelProfile:
    """A ModelProfile from a Hugging Face config.json (Llama-style fields);
    ValueError naming a missing field."""

    def field_(key: str) -> int:
        value = config.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"config.json: {key} must be a positive integer, got {value!r}")
        return value

    heads = field_("num_attention_heads")
    hidden = field_("hidden_size")
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    dtype_bytes = 4 if "32" in dtype else 2
    model = ModelProfile(
        name=name,
        num_layers=field_("num_hidden_layers"),
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        kv_dtype_bytes=dtype_bytes,
        hidden_size=hidden,
        intermediate_size=field_("intermediate_size"),
        num_attention_heads=heads,
        vocab_size=field_("vocab_size"),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        weight_dtype_bytes=dtype_bytes,
        source="config.json of the profiled engine's model",
    )
    return replace(model, param_bytes=model.param_count() * dtype_bytes)


def cpu_hardware(name: str, copies: Sequence[CopyTiming], kv_bytes: int) -> HardwareProfile:
    """This machine as the profile's hardware: the engine's KV space as its
    device memory, the host's memory, and the largest copy's rate as its
    memory bandwidth. Its compute peak is a nominal 1 TFLOP/s: every cost
    constant of the fitted model is measured, so the derived ones (which
    would use it) are never used."""
    largest = max(copies, key=lambda c: c.blocks)
    size = largest.blocks * largest.block_bytes
    gbps = size / max(min(largest.h2d_s, largest.d2h_s), 1e-9) / GB
    link = copy_link(copies, "in-process block copy")
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return HardwareProfile.from_link(
        name,
        hbm_bytes=max(kv_bytes, 1),
        link=link,
        host_memory_bytes=int(host),
        peak_bf16_tflops=1.0,
        hbm_gbps=gbps,
        source=f"measured by {PROFILE_TOOL} on {cpu_model_name()}",
    )


def cpu_model_name() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    return f"{cpu_model(text) or platform.processor() or 'unknown CPU'}, {os.cpu_count()} CPUs"


# Where a profile charges the fitted per-request work (prefill_s_per_sequence
# of the fit): in the iteration that prefills the request, or as the service
# time of a queue in front of the engine that requests pass one at a time
# (admission_s_per_request; prefill_s_per_sequence 0).
PER_REQUEST_ITERATION = "iteration"
PER_REQUEST_ADMISSION = "admission"
PER_REQUEST_WORK = (PER_REQUEST_ITERATION, PER_REQUEST_ADMISSION)


def build_profile(
    result: EngineProfile,
    model: ModelProfile,
    name: str,
    per_request: str = PER_REQUEST_ITERATION,
) -> MeasuredProfile:
    """The profile of a fit; per_request: where it charges the fitted
    per-request work (PER_REQUEST_WORK)."""
    if per_request not in PER_REQUEST_WORK:
        raise ValueError(f"per_request: one of {', '.join(PER_REQUEST_WORK)}, got {per_request!r}")
    limits = result.limits
    block_bytes = result.copies[0].block_bytes if result.copies else 1
    hardware = cpu_hardware(name, result.copies, limits.gpu_kv_blocks * block_bytes)
    fit = result.fit
    probes = len({run.probe for run in result.runs})
    repeats = 1 + max((run.repeat for run in result.runs), default=0)
    requests = sum(len(run.records) for run in result.runs)
    method = (
        f"{probes} synthetic batches x {repeats} repeats ({requests} streamed requests) "
        "over the OpenAI HTTP API, fitted through the replay engine (relative NNLS, "
        f"{result.rounds} rounds); block copies timed in process with "
        "planner.kernels.transfer_ref"
    )
    notes = (
        f"fit: median |relative error| {100 * fit.median_abs_error:.1f} %, p90 "
        f"{100 * fit.p90_abs_error:.1f} %, {fit.rows} times kept, {fit.dropped} outliers "
        f"dropped; client-side latency {1e3 * fit.latency_s:.2f} ms per request (HTTP, "
        "tokenization, streaming: request_latency_s); engine limits: block "
        f"{limits.block_size_tokens} tokens, {limits.gpu_kv_blocks} KV blocks, "
        f"{limits.max_batched_tokens} batched tokens, {limits.max_running} running; load "
        f"average {load_text(result.load_average_before)} before, "
        f"{load_text(result.load_average_after)} after"
    )
    constants = fit.cost.constants()
    admission: dict[tuple[str, int], float] = {}
    if per_request == PER_REQUEST_ADMISSION:
        admission[(model.name, 1)] = constants["prefill_s_per_sequence"]
        constants["prefill_s_per_sequence"] = 0.0
        notes += (
            f"; the fitted per-request work ({1e3 * admission[(model.name, 1)]:.2f} ms, "
            "prefill_s_per_sequence) is charged as admission_s_per_request: a queue in front "
            "of the engine that requests pass one at a time"
        )
    extra_terms: dict[tuple[str, int], dict[str, float]] = {}
    spread = result.step_spread
    if spread is not None:
        extra_terms[(model.name, 1)] = {"step_jitter_cv": spread.cv}
        notes += (
            f"; the engine's step times: p99 / p50 {spread.ratio:.2f} (median of "
            f"{len(spread.ratios)} decode probes), a lognormal of coefficient of variation "
            f"{spread.cv:.3f} (step_jitter_cv)"
        )
    return MeasuredProfile(
        name=name,
        hardware=hardware,
        description=f"{model.name} served at {result.url}, measured by {PROFILE_TOOL}",
        provenance={
            "kind": "measured",
            "source": f"{result.url} (served model {result.served_model})",
            "tool": PROFILE_TOOL,
            "method": method,
            "device": cpu_model_name(),
            "date": result.started,
        },
        models={model.name: model},
        cost={(model.name, 1): constants},
        cost_notes={(model.name, 1): notes},
        request_latency={(model.name, 1): fit.latency_s},
        admission=admission,
        extra_terms=extra_terms,
    )


def raw_runs(result: EngineProfile) -> dict[str, Any]:
    """Every probe request's token times, the limits and the copy timings
    (and where and when: engine_profile_from_raw reads it back)."""
    return {
        "url": result.url,
        "served_model": result.served_model,
        "started": result.started,
        "wall_s": result.wall_s,
        "load_average_before": result.load_average_before,
        "load_average_after": result.load_average_after,
        "limits": asdict(result.limits),
        "runs": [
            {
                "probe": asdict(run.probe),
                "repeat": run.repeat,
                "load_average": run.load_average,
                "records": [asdict(r) for r in run.records],
                "step_gaps": run.step_gaps,
            }
            for run in result.runs
        ],
        "copies": [asdict(c) for c in result.copies],
    }


def profile_engine(
    url: str,
    served_model: str,
    limits: EngineLimits,
    model: ModelProfile,
    *,
    probes: Sequence[Probe],
    repeats: int,
    seed: int | None = None,
    progress: Any = None,
) -> EngineProfile:
    """Runs the probes, fits them, times the copies (module docstring)."""
    fitted = [limits.fitted(p) for p in probes]
    chosen = list(dict.fromkeys(p for p in fitted if p is not None))
    if not chosen:
        raise ValueError("no probe fits the engine's limits")
    salt = seed if seed is not None else int.from_bytes(os.urandom(3), "big")
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    before = load_average()
    clock = time.perf_counter()
    runs = run_probes(url, served_model, chosen, repeats, salt, progress=progress)
    wall_s = time.perf_counter() - clock
    after = load_average()
    records = [r for run in runs for r in run.records]
    if not any(r.done for r in records):
        first = next((r.error for r in records if r.error), "no request finished")
        raise ValueError(f"every probe request failed, e.g. {first}")
    fit, rounds = fit_probes(runs, limits)
    copies = time_copies(model, limits.block_size_tokens)
    return EngineProfile(
        fit=fit,
        runs=runs,
        copies=copies,
        limits=limits,
        url=url,
        served_model=served_model,
        rounds=rounds,
        started=started,
        wall_s=wall_s,
        load_average_before=before,
        load_average_after=after,
        failed_requests=sum(1 for r in records if not r.done),
        merged_chunks=sum(r.merged_chunks for r in records),
    )


def engine_profile_from_raw(raw: dict[str, Any]) -> EngineProfile:
    """What raw_runs kept, fitted again (this version's fit): the same probe
    runs and copy timings."""
    limits = EngineLimits(**raw["limits"])
    runs = [
        ProbeRun(
            Probe(**run["probe"]),
            run["repeat"],
            [StreamRecord(**r) for r in run["records"]],
            run["load_average"],
            run.get("step_gaps", {}),
        )
        for run in raw["runs"]
    ]
    fit, rounds = fit_probes(runs, limits)
    records = [r for run in runs for r in run.records]
    return EngineProfile(
        fit=fit,
        runs=runs,
        copies=[CopyTiming(**c) for c in raw["copies"]],
        limits=limits,
        url=raw.get("url", "unknown"),
        served_model=raw.get("served_model", "unknown"),
        rounds=rounds,
        started=raw.get("started", "unknown"),
        wall_s=raw.get("wall_s", 0.0),
        load_average_before=raw.get("load_average_before"),
        load_average_after=raw.get("load_average_after"),
        failed_requests=sum(1 for r in records if not r.done),
        merged_chunks=sum(r.merged_chunks for r in records),
    )
