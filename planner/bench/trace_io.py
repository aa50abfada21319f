"""`planner bench trace-io`: how fast a large trace is imported and loaded.

It writes a seeded Azure-format CSV of --rows rows (default 1,000,000: the
TIMESTAMP, ContextTokens, GeneratedTokens columns of the public trace, 100 ns
timestamps, about 100 requests/s) to a temporary folder, then times, in this
process: the import by columns (`planner trace import`'s path) and the
import request by request (the strict path, which every bad source still
takes to name its line); loading the resulting JSON lines by columns
(`load_trace`) and line by line (`read_trace_lines`, the strict reader). It
checks that both ways give the same file and the same requests, and times
`planner trace import` as a command too (interpreter start included).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from planner.bench.machine import load_average, machine_info
from planner.trace.importers.base import ImportOptions
from planner.trace.importers.pipeline import import_trace, import_trace_to_file
from planner.trace.io import load_trace, read_trace_lines, write_trace
from planner.trace.stamp import Stamp

EXIT_OK = 0
EXIT_FAILED = 1
TARGETS_S = {"import by columns": 3.0, "load by columns": 2.0}
_START = np.datetime64("2023-11-16T18:15:46", "ns")


def register(benches: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = benches.add_parser(
        "trace-io",
        help="import and load speed of a large Azure-format trace",
        description=__doc__.split("\n\n")[1].replace("\n", " ") if __doc__ else None,
    )
    p.add_argument("--rows", type=int, default=1_000_000, help="rows of the CSV (default 1M)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated CSV")
    p.add_argument("--repeat", type=int, default=3, help="runs of each columnar step (default 3)")
    p.add_argument(
        "--no-strict", action="store_true", help="skip the request-by-request timings (slow)"
    )
    p.set_defaults(func=run)


def write_azure_csv(path: Path, rows: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    gaps_ns = np.round(rng.exponential(0.01, rows) * 1e7).astype(np.int64) * 100
    stamps = np.datetime_as_string(_START + np.cumsum(gaps_ns), unit="ns")
    prompt = np.maximum(1, rng.lognormal(6.5, 1.2, rows)).astype(np.int64)
    output = rng.integers(0, 800, rows)
    with path.open("w", encoding="utf-8", newline="") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\r\n")
        f.writelines(
            f"{s[:10]} {s[11:-2]},{p},{o}\r\n"
            for s, p, o in zip(stamps.tolist(), prompt.tolist(), output.tolist(), strict=True)
        )


def _timed(label: str, work: Callable[[], object]) -> tuple[float, object]:
    print(f"  {label} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    result = work()
    return time.perf_counter() - start, result


def run(args: argparse.Namespace) -> int:
    info = machine_info()
    print(
        f"machine: {info['cpu_model']}, {info['usable_cores']} usable cores, "
        f"load average {info['load_avg_1m_at_start']} at start",
        file=sys.stderr,
    )
    results: list[tuple[str, list[float]]] = []
    same = True
    with tempfile.TemporaryDirectory(prefix="planner-trace-io-") as tmp:
        folder = Path(tmp)
        source = folder / "azure.csv"
        write_azure_csv(source, args.rows, args.seed)
        size_mb = source.stat().st_size / 1e6
        columns_out = folder / "columns.jsonl"
        runs = [
            _timed(
                "import by columns",
                lambda: import_trace_to_file(
                    "azure", source, ImportOptions(), Stamp(), columns_out
                ),
            )[0]
            for _ in range(max(1, args.repeat))
        ]
        results.append(("import by columns", runs))
        loads = [_timed("load by columns", lambda: load_trace(columns_out)) for _ in runs]
        results.append(("load by columns", [seconds for seconds, _ in loads]))
        loaded = loads[0][1]
        planner_command = shutil.which("planner", path=str(Path(sys.executable).parent))
        command = [planner_command or "planner", "trace", "import", "--format", "azure"]
        command_out = folder / "command.jsonl"
        seconds, _ = _timed(
            "planner trace import (command)",
            lambda: subprocess.run(
                [*command, str(source), "-o", str(command_out)], check=True, capture_output=True
            ),
        )
        results.append(("`planner trace import` command (start-up included)", [seconds]))
        same = command_out.read_bytes() == columns_out.read_bytes()
        if not args.no_strict:
            strict_out = folder / "strict.jsonl"

            def strict_import() -> None:
                requests, _ = import_trace("azure", source, ImportOptions())
                write_trace(strict_out, requests)

            seconds, _ = _timed("import request by request", strict_import)
            results.append(("import request by request (strict)", [seconds]))
            seconds, strict_loaded = _timed(
                "load line by line", lambda: read_trace_lines(columns_out)
            )
            results.append(("load line by line (strict)", [seconds]))
            same = (
                same
                and strict_out.read_bytes() == columns_out.read_bytes()
                and strict_loaded == loaded
            )
    print(
        f"trace-io: {args.rows:,} rows, {size_mb:.0f} MB of CSV; load average "
        f"{load_average()} at the end"
    )
    print("| step | runs | median s | slowest s | target s |")
    print("|---|---:|---:|---:|---:|")
    for label, times in results:
        target = TARGETS_S.get(label)
        print(
            f"| {label} | {len(times)} | {statistics.median(times):.2f} | {max(times):.2f} | "
            f"{'' if target is None else f'<= {target:g}'} |"
        )
    print(f"same output both ways: {'yes' if same else 'NO'}")
    return EXIT_OK if same else EXIT_FAILED
