"""`planner bench` subcommands."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("bench", help="measure decision latency")
    p.set_defaults(func=lambda args: 0)
