"""`planner bench kernels`: the GPU kernels' benchmark (planner.bench.kernels_gpu).

On a CUDA machine it checks every kernel against its torch reference on the
device, then measures transfer bandwidth, the SuperInfer Table 1 workload
(naive, per-block, batched, duplex) and HybridGEMM, and writes kernels.json
and a hardware profile (profile.json, loadable by `planner replay --profile`)
under --out. `--smoke` runs it at tiny sizes on any device (CI does).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

EXIT_BAD_INPUT = 2


def register(benches: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = benches.add_parser(
        "kernels",
        help="GPU kernels: transfers, duplex, HybridGEMM (needs the kernels extra)",
        description=__doc__.split("\n\n")[1].replace("\n", " ") if __doc__ else None,
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ.get("OUT") or "out/kernels"),
        help="folder for kernels.json and profile.json (default $OUT or out/kernels)",
    )
    p.add_argument("--smoke", action="store_true", help="tiny sizes, any device (a CPU check)")
    p.add_argument("--skip-gemm", action="store_true", help="skip the HybridGEMM measurements")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    missing = [m for m in ("torch", "triton") if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"planner bench kernels: {' and '.join(missing)} not installed; install the "
            "kernels extra (`pip install 'planner[kernels]'`, or `make test` which pins "
            "the CPU wheel)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    # planner.kernels is typed through a stub without submodules (mypy),
    # and imports torch only when the benchmark runs.
    kernels_gpu = importlib.import_module("planner.bench.kernels_gpu")
    argv = ["--out", str(args.out)]
    if args.smoke:
        argv.append("--smoke")
    if args.skip_gemm:
        argv.append("--skip-gemm")
    status: int = kernels_gpu.main(argv)
    return status
