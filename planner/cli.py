"""The `planner` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from planner._version import __version__
from planner.bench import command as bench
from planner.bench import profile_command as profile_cmd
from planner.commands import call, replay, serve, sweep, trace
from planner.commands import profiles as profiles_cmd
from planner.commands.config_file import parse_with_config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="planner",
        description="The policy brain for LLM serving engines: plans over gRPC, "
        "one decision from JSON, trace replays, benchmarks.",
    )
    parser.add_argument("--version", action="version", version=f"planner {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    replay.register(subparsers)
    sweep.register(subparsers)
    serve.register(subparsers)
    call.register(subparsers)
    trace.register(subparsers)
    profiles_cmd.register(subparsers)
    profile_cmd.register(subparsers)
    bench.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parse_with_config(parser, argv)
    if not hasattr(args, "func"):
        parser.print_help(sys.stderr)
        return 2
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
