"""One attainment-vs-load figure (TTFT, TPOT, both met; plus output tokens/s
relative to dedicated's) from several `planner replay --topology serverless
--json-out` files of the same trace and settings, each with some of the
policies (docs/serverless.md, "Shares end"): the sweeps run as separate
processes so that the policies whose code did not change need not wait for
the ones that did. A policy in two files: the later file wins; a table of
the cells goes to stdout (TTFT / TPOT / both-met % ; tokens/s). A file
given as ``A.json@old=new`` has its policy ``old`` shown as ``new`` (a run
from before a policy's rename).

    .venv/bin/python docs/serverless/sweep_plot.py OUT.png A.json B.json@c2cserve=x ...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from planner.replay.plots import DPI, policy_colors

PANELS = (
    ("TTFT SLO attainment", "ttft_attainment"),
    ("TPOT SLO attainment (request-level)", "tpot_attainment"),
    ("Both met (goodput)", "both_attainment"),
)


def load(paths: list[str]) -> dict[str, dict[float, dict[str, Any]]]:
    """Policy -> rate scale -> that run's metrics."""
    out: dict[str, dict[float, dict[str, Any]]] = {}
    for arg in paths:
        path, _, rename = arg.partition("@")
        old, _, new = rename.partition("=")
        for entry in json.loads(Path(path).read_text(encoding="utf-8"))["sweep"]:
            for m in entry["metrics"]:
                name = new if old and m["policy"] == old else m["policy"]
                out.setdefault(name, {})[float(entry["rate_scale"])] = m
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("json", nargs="+")
    p.add_argument("--title", default="")
    args = p.parse_args()
    runs = load(args.json)
    names = list(runs)
    scales = sorted({s for by in runs.values() for s in by})
    colors = policy_colors(names)
    fig = Figure(figsize=(17.0, 4.5), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 4)
    base = runs.get("dedicated", {})
    for ax, (title, key) in zip(
        axes, (*PANELS, ("Output tokens/s / dedicated's", "")), strict=True
    ):
        for i, name in enumerate(names):
            xs = [s for s in scales if s in runs[name] and (key or s in base)]
            if key:
                ys = [runs[name][s][key] for s in xs]
            else:
                ys = [
                    (runs[name][s]["throughput_tok_s"] or 0.0) / base[s]["throughput_tok_s"]
                    if base[s]["throughput_tok_s"]
                    else float("nan")
                    for s in xs
                ]
            ax.plot(xs, ys, color=colors[name], marker="osD^v<>ph*"[i % 10], label=name)
        ax.set_title(title)
        ax.set_xscale("log")
        ax.set_xticks(scales, [f"{s:g}x" for s in scales])
        ax.minorticks_off()
        ax.grid(True, alpha=0.3)
        ax.set_xlabel("Request rate (multiple of the trace rate)")
        if key:
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
            ax.set_ylim(-0.02, 1.02)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper center", ncols=min(len(labels), 8))
    if args.title:
        fig.suptitle(args.title, y=-0.02, va="top")
    fig.savefig(args.out, format="png", dpi=DPI)
    print("| rate | " + " | ".join(names) + " |")
    print("|---:|" + "---:|" * len(names))
    for s in scales:
        cells = []
        for name in names:
            m = runs[name].get(s)
            cells.append(
                "—"
                if m is None
                else f"{100 * m['ttft_attainment']:.1f} / {100 * m['tpot_attainment']:.1f} / "
                f"**{100 * m['both_attainment']:.1f}** ; {m['throughput_tok_s'] or 0:.6g}"
            )
        print(f"| x{s:g} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
