"""`planner profile`: measure a running engine's iteration and copy costs and
write a measured profile (`planner-profile/1`) for `planner replay --profile
MODEL@FILE.json`. How it measures: planner.bench.engine_profile.

    planner profile --url http://127.0.0.1:8000 --model-dir DIR \\
        --block-size 32 --gpu-kv-blocks 512 --max-batched-tokens 2048 \\
        --max-running 128 --max-model-len 1024 --out cpu.json

Exit codes: 0 written, 1 the engine failed the probes (unreachable, errors),
2 bad input (one line on stderr naming the flag).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from planner.bench.engine_profile import (
    DECODE_PROBES,
    PER_REQUEST_ITERATION,
    PER_REQUEST_WORK,
    PREFILL_PROBES,
    QUICK_PROBES,
    EngineLimits,
    EngineProfile,
    Probe,
    build_profile,
    load_text,
    model_from_config,
    profile_engine,
    raw_runs,
)
from planner.bench.openai_stream import Endpoint
from planner.output_paths import OutputPathError, check_output_file
from planner.profiles.errors import ProfileError
from planner.profiles.loading import save_profile

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "profile",
        help="measure a running engine's costs into a profile replay loads",
        description="Drive a running engine's OpenAI-compatible HTTP API with synthetic "
        "batches (streamed, client-side token times), fit the replay's iteration cost "
        "model to them through the replay engine itself, time block copies in process, "
        "and write a measured profile (format: fixtures/profiles/README.md) that "
        "`planner replay --profile MODEL@FILE.json` loads. Pass the engine's own limits: "
        "the fit replays each probe under them.",
    )
    p.add_argument("--url", required=True, help="the engine's base URL, http://HOST:PORT")
    p.add_argument(
        "--model-dir",
        type=Path,
        required=True,
        help="the served model's folder (its config.json gives the model's shape)",
    )
    p.add_argument(
        "--served-model", help="the model name the API serves (default: --model-dir as given)"
    )
    p.add_argument(
        "--model-name",
        help="the model's name in the profile, MODEL in MODEL@FILE.json (default: the "
        "folder's name)",
    )
    p.add_argument("--name", help="the profile's name (default: MODEL-engine)")
    p.add_argument("--block-size", type=int, required=True, help="tokens per KV block")
    p.add_argument("--gpu-kv-blocks", type=int, required=True, help="the engine's KV blocks")
    p.add_argument(
        "--max-batched-tokens", type=int, required=True, help="tokens per iteration at most"
    )
    p.add_argument("--max-running", type=int, required=True, help="running requests at most")
    p.add_argument(
        "--max-model-len", type=int, required=True, help="prompt + output tokens at most"
    )
    p.add_argument("--repeats", type=int, default=3, help="times each probe runs (default 3)")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{len(QUICK_PROBES)} probes instead of {len(DECODE_PROBES) + len(PREFILL_PROBES)}",
    )
    p.add_argument(
        "--seed",
        type=int,
        help="salts the prompts (default: random, so that no prompt is in the engine's "
        "prefix cache from an earlier run)",
    )
    p.add_argument("--out", type=Path, required=True, help="the profile JSON to write")
    p.add_argument(
        "--raw-out", type=Path, help="also write every probe request's token times as JSON"
    )
    p.add_argument(
        "--per-request-work",
        choices=PER_REQUEST_WORK,
        default=PER_REQUEST_ITERATION,
        help="where the profile charges the fitted per-request work: in the iteration that "
        "prefills the request (prefill_s_per_sequence, the default) or as the service time "
        "of a queue in front of the engine that requests pass one at a time "
        "(admission_s_per_request: what `planner bench calibration` found vLLM to do)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(func=run)


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> int:
    print(f"planner profile: {message}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    try:
        Endpoint.parse(args.url)
    except ValueError as exc:
        return _fail(f"--url: {exc}")
    for flag in (
        "block_size",
        "gpu_kv_blocks",
        "max_batched_tokens",
        "max_running",
        "max_model_len",
        "repeats",
    ):
        value = getattr(args, flag)
        if value < 1:
            return _fail(f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    try:
        check_output_file("--out", args.out)
        check_output_file("--raw-out", args.raw_out)
    except OutputPathError as exc:
        return _fail(str(exc))
    config_path = args.model_dir / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return _fail(f"--model-dir: cannot read {config_path}: {exc}")
    model_name = args.model_name or args.model_dir.resolve().name
    try:
        model = model_from_config(config, model_name)
    except (ValueError, ProfileError) as exc:
        return _fail(f"--model-dir: {exc}")
    limits = EngineLimits(
        block_size_tokens=args.block_size,
        gpu_kv_blocks=args.gpu_kv_blocks,
        max_batched_tokens=args.max_batched_tokens,
        max_running=args.max_running,
        max_model_len=args.max_model_len,
    )
    probes = QUICK_PROBES if args.quick else (*DECODE_PROBES, *PREFILL_PROBES)

    def progress(done: int, total: int, probe: Probe) -> None:
        if not args.quiet:
            print(f"  probe {done}/{total}: {probe.name}", file=sys.stderr, flush=True)

    try:
        result = profile_engine(
            args.url,
            args.served_model or str(args.model_dir),
            limits,
            model,
            probes=probes,
            repeats=args.repeats,
            seed=args.seed,
            progress=progress,
        )
    except ValueError as exc:
        return _fail(str(exc), EXIT_FAILED)
    total = sum(len(run.records) for run in result.runs)
    if result.failed_requests:
        first = next(r.error for run in result.runs for r in run.records if not r.done)
        print(
            f"planner profile: {result.failed_requests} of {total} requests failed (left out "
            f"of the fit), e.g. {first}",
            file=sys.stderr,
        )
    profile = build_profile(
        result, model, args.name or f"{model_name}-engine", args.per_request_work
    )
    save_profile(profile, args.out)
    if args.raw_out is not None:
        args.raw_out.parent.mkdir(parents=True, exist_ok=True)
        args.raw_out.write_text(json.dumps(raw_runs(result), indent=1), encoding="utf-8")
    print(summary(result, model_name, args.out))
    return EXIT_OK


def summary(result: EngineProfile, model_name: str, out: Path) -> str:
    fit = result.fit
    c = fit.cost
    largest = result.copies[-1]
    size = largest.blocks * largest.block_bytes
    return "\n".join(
        [
            f"wrote {out}: replay it with --profile {model_name}@{out}",
            f"  per iteration: {1e3 * c.overhead_s:.3f} ms + "
            f"{1e6 * c.prefill_s_per_token:.2f} us/prefill token + "
            f"{1e6 * c.decode_s_per_token:.2f} us/decode token + "
            f"{1e9 * c.attn_s_per_context_token:.2f} ns/attended context token + "
            f"{1e6 * c.prefill_s_per_sequence:.1f} us/prefilling sequence (per-request work)",
            f"  client-side latency {1e3 * fit.latency_s:.2f} ms per request (request_latency_s)",
            f"  fit: median |error| {100 * fit.median_abs_error:.1f} %, p90 "
            f"{100 * fit.p90_abs_error:.1f} % over {fit.rows} times ({fit.dropped} outliers), "
            f"{result.rounds} rounds",
            f"  copies of {largest.blocks} blocks ({size / 2**20:.1f} MiB): "
            f"{size / largest.h2d_s / 1e9:.2f} GB/s in, {size / largest.d2h_s / 1e9:.2f} GB/s out",
            f"  {sum(len(r.records) for r in result.runs)} requests in {result.wall_s:.1f} s, "
            f"{result.merged_chunks} chunks carried several tokens; load average "
            f"{load_text(result.load_average_before)} before, "
            f"{load_text(result.load_average_after)} after",
        ]
    )
