"""`planner trace import|export|gen|stats`: make, convert and inspect request traces.

Exit codes: 0 done; 2 bad input (a bad line of a file, named by file:line
and field, or a bad option), one line on stderr, nothing written; 1 anything
else (the output cannot be written, ...).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias

from planner.input_file import STDIN, display_name
from planner.output_paths import OutputPathError, check_output_file
from planner.trace.arrivals import RateSchedule, check_burstiness
from planner.trace.errors import SpecError, TraceError
from planner.trace.exporters import EXPORTERS, export_trace
from planner.trace.generate import GenConfig, check_seed, generate
from planner.trace.importers import CONVERTERS
from planner.trace.importers.base import ImportOptions
from planner.trace.importers.pipeline import import_trace_to_file
from planner.trace.io import MAX_LINE_BYTES, MAX_TRACE_BYTES, load_trace, write_trace
from planner.trace.length_model import LengthModel, build_length_model
from planner.trace.lengths_file import read_lengths_file
from planner.trace.presets import PRESETS
from planner.trace.stamp import Stamp
from planner.trace.stats import compute_stats, stats_to_json
from planner.trace.stats_table import render_stats

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

_LENGTHS_HELP = f"""\
lengths:
  --lengths PRESET     a preset fitted to public length statistics:
                         {", ".join(PRESETS)} (see planner/trace/presets.py)
  --lengths SPEC       one distribution for both prompt and output:
                         fixed:N | uniform:low=A,high=B |
                         lognormal:median=M,sigma=S[,max=X] | quantiles:0=V,...,100=V
  --prompt-lengths SPEC / --output-lengths SPEC override one side
  --lengths-file FILE  resample (prompt, output) pairs of a .csv or .jsonl file
                       (columns prompt_tokens/output_tokens, num_prefill_tokens/
                       num_decode_tokens, ContextTokens/GeneratedTokens, ...)
"""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    pass


def _para(text: str, indent: str = "") -> str:
    return textwrap.fill(
        text, width=79, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False
    )


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser(
        "trace",
        help="make and inspect request traces (import, export, gen, stats)",
        description="Request traces in the JSON-lines format of `planner replay`: one request "
        "per line with arrival_s, prompt_tokens, output_tokens (and optional id, model, "
        "tenant, priority, slo_ttft_s, slo_tbt_s, prefix_block_ids).",
    )
    sub = p.add_subparsers(dest="trace_command", metavar="COMMAND")
    _register_import(sub)
    _register_export(sub)
    _register_gen(sub)
    _register_stats(sub)
    p.set_defaults(func=lambda args: _usage(p))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_BAD_INPUT


def _add_stamp_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("fields set on every request")
    g.add_argument("--model", metavar="NAME", help="model of every request that names none")
    g.add_argument("--tenant", metavar="NAME", help="tenant of every request that names none")
    g.add_argument(
        "--slo-ttft-s", type=float, metavar="S", help="TTFT SLO of every request, seconds"
    )
    g.add_argument("--slo-tbt-s", type=float, metavar="S", help="TBT SLO of every request, seconds")
    g.add_argument(
        "--id-prefix", metavar="PREFIX", help="give ids PREFIX0, PREFIX1, ... in arrival order"
    )


def _add_length_options(p: argparse.ArgumentParser, default_note: str) -> None:
    g = p.add_argument_group(f"lengths ({default_note})")
    g.add_argument("--lengths", metavar="PRESET|SPEC", help="a preset or one distribution spec")
    g.add_argument("--prompt-lengths", metavar="SPEC", help="prompt length distribution")
    g.add_argument("--output-lengths", metavar="SPEC", help="output length distribution")
    g.add_argument("--lengths-file", metavar="FILE", help="resample length pairs of a file")
    g.add_argument("--max-prompt-tokens", type=int, metavar="N", help="clamp prompts to N")
    g.add_argument("--max-output-tokens", type=int, metavar="N", help="clamp outputs to N")


def _add_arrival_options(p: argparse.ArgumentParser, title: str) -> None:
    g = p.add_argument_group(title)
    rate = g.add_mutually_exclusive_group()
    rate.add_argument("--rate", type=float, metavar="RPS", help="constant rate, requests/s")
    rate.add_argument(
        "--rate-schedule",
        metavar="S:RPS,...",
        help='piecewise-constant rate, e.g. "0:5,60:20,90:5" (5 rps, 20 from 60 s, 5 from 90 s)',
    )
    g.add_argument(
        "--burstiness",
        type=float,
        metavar="CV",
        help="coefficient of variation of the gaps: 1 Poisson (default), >1 burstier "
        "(Gamma gaps), 0 evenly spaced",
    )
    g.add_argument("--seed", type=int, metavar="N", help="random seed (default 0)")


def _format_list(helps: dict[str, str], width: int) -> str:
    """An epilog's list of formats: each name padded to ``width``, its help
    wrapped under itself."""
    return "\n".join(
        textwrap.fill(
            f"{name:<{width}} {text}",
            width=79,
            initial_indent="  ",
            subsequent_indent=" " * (width + 3),
            break_on_hyphens=False,
        )
        for name, text in helps.items()
    )


def _register_import(sub: Subparsers) -> None:
    formats = _format_list({name: c.help for name, c in CONVERTERS.items()}, 17)
    p = sub.add_parser(
        "import",
        help="convert a public trace to JSON lines",
        formatter_class=_Formatter,
        description=_para(
            "Convert a public trace (see ../shared/traces/README.md) to our JSON lines, "
            "atomically. Arrivals are seconds from the source's first row (sources out of "
            "time order are sorted). Prints what was dropped or changed."
        ),
        epilog=f"formats:\n{formats}\n\n"
        + _para(
            "Decisions: token counts of 0 become 1 (counted), except BurstGPT's failed "
            "requests (0 response tokens), which are dropped (counted); BurstGPT's Log Type "
            "becomes the tenant; Alibaba rows without a model are dropped (counted). "
            "sharegpt-lengths has no times: give --rate (arrivals generated with --seed). "
            "alibaba has no token counts: give --prompt-tokens/--output-tokens, --lengths or "
            "--lengths-file. --start/--duration keep [S, S+D) and shift S to 0."
        )
        + "\n\n"
        + _LENGTHS_HELP,
    )
    p.add_argument("source", metavar="SRC", help="the public trace file")
    p.add_argument("--format", required=True, choices=list(CONVERTERS), help="its format")
    p.add_argument("-o", "--output", required=True, metavar="OUT.jsonl", help="trace to write")
    w = p.add_argument_group("window")
    w.add_argument("--start", type=float, metavar="S", help="drop requests before S seconds")
    w.add_argument("--duration", type=float, metavar="S", help="keep S seconds from --start")
    w.add_argument("--limit", type=int, metavar="N", help="keep the first N requests")
    _add_arrival_options(p, "arrivals (sharegpt-lengths only)")
    g = p.add_argument_group("token counts (alibaba only)")
    g.add_argument("--prompt-tokens", type=int, metavar="N", help="every prompt has N tokens")
    g.add_argument("--output-tokens", type=int, metavar="N", help="every output has N tokens")
    _add_length_options(p, "alibaba only")
    _add_stamp_options(p)
    p.set_defaults(func=run_import)


def _register_export(sub: Subparsers) -> None:
    formats = _format_list(
        {name: f"{e.help}. {' '.join(e.notes)}" for name, e in EXPORTERS.items()}, 15
    )
    p = sub.add_parser(
        "export",
        help="convert a JSON-lines trace to another tool's format",
        formatter_class=_Formatter,
        description=_para(
            "Write a JSON-lines trace in another tool's trace format, atomically. Prints "
            "the fields the format cannot carry (and on how many requests they were set)."
        ),
        epilog=f"formats:\n{formats}",
    )
    add_trace_argument(p)
    p.add_argument("--format", required=True, choices=list(EXPORTERS), help="format to write")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="file to write")
    p.set_defaults(func=run_export)


def _register_gen(sub: Subparsers) -> None:
    p = sub.add_parser(
        "gen",
        help="generate a synthetic trace",
        formatter_class=_Formatter,
        description=_para(
            "Generate a synthetic trace: renewal arrivals (Poisson, or Gamma gaps with the "
            "given CV) at a rate or a rate schedule (exact, by time rescaling), lengths from "
            "a fitted preset, a distribution, or resampled from a file. Deterministic for a "
            "seed; arrivals rounded to the microsecond."
        ),
        epilog=_LENGTHS_HELP
        + "\nexample:\n  planner trace gen --rate 10 --duration 120 --lengths sharegpt "
        "--seed 0 -o trace.jsonl",
    )
    p.add_argument("-o", "--output", required=True, metavar="OUT.jsonl", help="trace to write")
    _add_arrival_options(p, "arrivals (one of --rate, --rate-schedule is required)")
    n = p.add_argument_group("size (one or both; generation stops at whichever comes first)")
    n.add_argument("--duration", type=float, metavar="S", help="arrivals in [0, S) seconds")
    n.add_argument("--num-requests", type=int, metavar="N", help="the first N arrivals")
    _add_length_options(p, "default: the sharegpt preset")
    _add_stamp_options(p)
    p.set_defaults(func=run_gen)


def add_trace_argument(p: argparse.ArgumentParser) -> None:
    """The TRACE.jsonl positional argument and the cap on its size."""
    p.add_argument(
        "trace",
        metavar="TRACE.jsonl",
        help="JSON-lines trace: a regular file, or - for standard input",
    )
    p.add_argument(
        "--max-trace-bytes",
        type=int,
        default=MAX_TRACE_BYTES,
        metavar="N",
        help=f"refuse a trace larger than this (default {MAX_TRACE_BYTES:,}; every line "
        f"at most {MAX_LINE_BYTES:,} bytes)",
    )


def check_max_trace_bytes(value: int) -> None:
    if value <= 0:
        raise SpecError("--max-trace-bytes", f"must be > 0, got {value}")


def _register_stats(sub: Subparsers) -> None:
    p = sub.add_parser(
        "stats",
        help="print rate, burstiness and length statistics of a trace",
        description="Statistics of a JSON-lines trace: count, span, mean rate ((n-1)/span), "
        "rate in windows, burstiness (CV of inter-arrival gaps), prompt/output length mean "
        "and p50/p90/p99, requests per model.",
    )
    add_trace_argument(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument(
        "--window",
        type=float,
        metavar="S",
        help="rate window (default 60 s; for traces shorter than 10 min, the largest of "
        "1, 2, 5, 10, 15, 30 s giving 10 full windows)",
    )
    p.add_argument("--sort", action="store_true", help="accept an unsorted trace (sort it)")
    p.set_defaults(func=run_stats)


def _fail(command: str, message: str, code: int = EXIT_BAD_INPUT) -> int:
    print(f"planner trace {command}: {message}", file=sys.stderr)
    return code


def _schedule(args: argparse.Namespace) -> RateSchedule | None:
    if args.rate_schedule is not None:
        return RateSchedule.parse(args.rate_schedule)
    if args.rate is not None:
        return RateSchedule.constant(args.rate)
    return None


def _burstiness(args: argparse.Namespace) -> float:
    return 1.0 if args.burstiness is None else check_burstiness(args.burstiness)


def _seed(args: argparse.Namespace) -> int:
    return 0 if args.seed is None else check_seed(args.seed)


def _stamp(args: argparse.Namespace) -> Stamp:
    return Stamp(
        model=args.model,
        tenant=args.tenant,
        slo_ttft_s=args.slo_ttft_s,
        slo_tbt_s=args.slo_tbt_s,
        id_prefix=args.id_prefix,
    )


def _length_model(args: argparse.Namespace, default: str | None) -> LengthModel | None:
    fixed_prompt = getattr(args, "prompt_tokens", None)
    fixed_output = getattr(args, "output_tokens", None)
    prompt_lengths, output_lengths = args.prompt_lengths, args.output_lengths
    for option, value in (("--prompt-tokens", fixed_prompt), ("--output-tokens", fixed_output)):
        if value is not None and value < 1:
            raise SpecError(option, f"must be >= 1, got {value}")
    if fixed_prompt is not None:
        if prompt_lengths is not None:
            raise SpecError("--prompt-tokens", "cannot be combined with --prompt-lengths")
        prompt_lengths = f"fixed:{fixed_prompt}"
    if fixed_output is not None:
        if output_lengths is not None:
            raise SpecError("--output-tokens", "cannot be combined with --output-lengths")
        output_lengths = f"fixed:{fixed_output}"
    chosen = (args.lengths, prompt_lengths, output_lengths, args.lengths_file)
    if default is None and all(v is None for v in chosen):
        if args.max_prompt_tokens is not None or args.max_output_tokens is not None:
            raise SpecError("--max-prompt-tokens", "clamps need lengths to clamp")
        return None
    resampled = None
    if args.lengths_file is not None:
        if any(v is not None for v in (args.lengths, prompt_lengths, output_lengths)):
            raise SpecError(
                "--lengths-file",
                "cannot be combined with --lengths/--prompt-lengths/--output-lengths",
            )
        resampled = read_lengths_file(args.lengths_file).lengths
    return build_length_model(
        lengths=args.lengths,
        prompt_lengths=prompt_lengths,
        output_lengths=output_lengths,
        max_prompt_tokens=args.max_prompt_tokens,
        max_output_tokens=args.max_output_tokens,
        resampled=resampled,
        default=default,
    )


# Format-specific options: the ImportOptions field → the flags that set it
# (flag, attribute of the parsed arguments).
_FORMAT_OPTIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "schedule": (("--rate", "rate"), ("--rate-schedule", "rate_schedule")),
    "burstiness": (("--burstiness", "burstiness"),),
    "seed": (("--seed", "seed"),),
    "lengths": (
        ("--lengths", "lengths"),
        ("--prompt-lengths", "prompt_lengths"),
        ("--output-lengths", "output_lengths"),
        ("--lengths-file", "lengths_file"),
        ("--prompt-tokens", "prompt_tokens"),
        ("--output-tokens", "output_tokens"),
        ("--max-prompt-tokens", "max_prompt_tokens"),
        ("--max-output-tokens", "max_output_tokens"),
    ),
}


def _check_format_options(args: argparse.Namespace, accepted: frozenset[str]) -> None:
    for option, flags in _FORMAT_OPTIONS.items():
        if option in accepted:
            continue
        for flag, attr in flags:
            if getattr(args, attr) is not None:
                users = [n for n, c in CONVERTERS.items() if option in c.options]
                raise SpecError(
                    flag,
                    f"does not apply to --format {args.format} (only to {', '.join(users)})",
                )


def _write_trace_output(
    command: str, args: argparse.Namespace, write: Callable[[argparse.Namespace], list[str]]
) -> int:
    """Checks --output, runs write (it writes the file and returns the lines
    that sum it up), prints those lines and `wrote OUTPUT`: exit 2 on bad
    input, 1 when the file cannot be written."""
    try:
        check_output_file("--output", args.output)
        summary = write(args)
    except (TraceError, SpecError, OutputPathError) as exc:
        return _fail(command, str(exc))
    except OSError as exc:
        return _fail(command, f"cannot write {args.output}: {exc.strerror or exc}", EXIT_FAILED)
    for line in summary:
        print(line)
    print(f"wrote {args.output}")
    return EXIT_OK


def _write_imported(args: argparse.Namespace) -> list[str]:
    converter = CONVERTERS[args.format]
    _check_format_options(args, converter.options)
    options = ImportOptions(
        limit=args.limit,
        start_s=args.start,
        duration_s=args.duration,
        schedule=_schedule(args),
        burstiness=_burstiness(args),
        seed=_seed(args),
        lengths=_length_model(args, default=None) if "lengths" in converter.options else None,
    )
    return import_trace_to_file(
        args.format, args.source, options, _stamp(args), args.output
    ).lines()


def _write_exported(args: argparse.Namespace) -> list[str]:
    check_max_trace_bytes(args.max_trace_bytes)
    requests = load_trace(args.trace, max_bytes=args.max_trace_bytes)
    return export_trace(EXPORTERS[args.format], requests, args.output).lines()


def _write_generated(args: argparse.Namespace) -> list[str]:
    schedule = _schedule(args)
    if schedule is None:
        raise SpecError("--rate", "give --rate RPS or --rate-schedule S:RPS,...")
    lengths = _length_model(args, default="sharegpt")
    assert lengths is not None
    config = GenConfig(
        schedule=schedule,
        lengths=lengths,
        burstiness=_burstiness(args),
        seed=_seed(args),
        duration_s=args.duration,
        num_requests=args.num_requests,
    )
    requests = _stamp(args).apply(generate(config))
    count = write_trace(args.output, requests)
    span = requests[-1].arrival_s - requests[0].arrival_s
    rate = (count - 1) / span if span > 0 else float("nan")
    return [
        f"generated {count:,} requests, arrivals {requests[0].arrival_s:.3f} s .. "
        f"{requests[-1].arrival_s:.3f} s, mean rate {rate:.2f} rps "
        f"({schedule.describe()}, burstiness {config.burstiness:g}, seed {config.seed}); "
        f"lengths: {lengths.describe()}"
    ]


def run_import(args: argparse.Namespace) -> int:
    return _write_trace_output("import", args, _write_imported)


def run_export(args: argparse.Namespace) -> int:
    return _write_trace_output("export", args, _write_exported)


def run_gen(args: argparse.Namespace) -> int:
    return _write_trace_output("gen", args, _write_generated)


def run_stats(args: argparse.Namespace) -> int:
    try:
        if args.window is not None and not (math.isfinite(args.window) and args.window > 0):
            raise SpecError("--window", f"must be > 0, got {args.window}")
        check_max_trace_bytes(args.max_trace_bytes)
        requests = load_trace(args.trace, sort=args.sort, max_bytes=args.max_trace_bytes)
        stats = compute_stats(requests, window_s=args.window)
    except (TraceError, SpecError) as exc:
        return _fail("stats", str(exc))
    if args.json:
        _emit(json.dumps(stats_to_json(stats), indent=2) + "\n")
    else:
        name = display_name(args.trace) if args.trace == STDIN else Path(args.trace).name
        _emit(render_stats(stats, f"trace {name}"))
    return EXIT_OK


def _emit(text: str) -> None:
    """Write to stdout; a reader that goes away early (`| head`) is fine."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # Point stdout at /dev/null so the interpreter's final flush is quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
