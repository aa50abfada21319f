"""Kernels benchmark: checks every kernel against its torch reference on the
device, then times it, and writes ``kernels.json`` and a hardware profile
(``planner-profile/1``, loadable by ``planner replay --profile FILE``) under
``--out`` (default ``$OUT`` or ``out/kernels``).

On a GPU machine, in one go::

    python -m planner.bench.kernels_gpu --out "$OUT"

``--smoke`` runs the same code paths with tiny sizes on whatever device there
is (CPU included: host timers, Triton through its interpreter) for the tests.

Measured (SuperInfer Table 1 / C2CServe §5 / issue 8):
- copy bandwidth vs transfer size, D2H and H2D alone and both at once;
- the Table 1 workload (Qwen2.5-32B KV: 64 layers, 8 KV heads of 128, bf16,
  16-token blocks, 4 MiB per block; 8 GiB per direction, scaled down to fit
  the card): naive per-segment copies on a layer-first cache, per-block copies
  on a block-first cache (MS), one batched launch per direction run one
  direction at a time (MS+MK, with cudaMemcpyBatchAsync and with the Triton
  kernel), and both directions at once on two streams (DuplexKV);
- HybridGEMM at rho in [0, 1] with W in HBM and in page-locked host memory,
  against torch matmul.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from planner.kernels.duplex import DuplexEngine, Method
from planner.kernels.extents import make_batch
from planner.kernels.harness import RotationEvent, run_decode
from planner.kernels.hybrid_gemm import Tiles, hybrid_gemm_reference
from planner.kernels.layout import KVLayout, KVShape, allocate, to_layer_first
from planner.kernels.pack import gather_reference, pack_layout
from planner.kernels.tiny_model import TinyConfig, TinyTransformer
from planner.kernels.transfer_batch import CopyDirection, TransferBatch
from planner.kernels.transfer_memcpy import memcpy_batch_available
from planner.kernels.transfer_naive import copy_per_block, copy_per_segment
from planner.kernels.transfer_ref import run_batch_reference
from planner.kernels.triton_support import can_run
from planner.profiles.loading import loads_profile

GB = 1e9
MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class Sizes:
    sweep_bytes: tuple[int, ...]
    table1: KVShape
    table1_blocks: int
    naive_blocks: int
    gemm_shapes: tuple[tuple[int, int, int], ...]
    rhos: tuple[float, ...]
    reps: int


SMOKE = Sizes(
    sweep_bytes=(4096, 65536),
    table1=KVShape(4, 0, 4, 2, 16),
    table1_blocks=8,
    naive_blocks=4,
    gemm_shapes=((16, 32, 48),),
    rhos=(0.0, 0.5, 1.0),
    reps=1,
)


def full_sizes(device: torch.device) -> Sizes:
    qwen = KVShape(64, 0, 16, 8, 128)  # 4 MiB per block in bf16
    free, _total = torch.cuda.mem_get_info(device)
    block = qwen.block_elems * 2
    per_direction = min(8 << 30, int(free * 0.15))
    return Sizes(
        sweep_bytes=tuple(1 << p for p in range(14, 30, 2)),  # 16 KiB .. 256 MiB
        table1=qwen,
        table1_blocks=max(16, per_direction // block),
        naive_blocks=64,
        gemm_shapes=((16, 8192, 8192), (256, 8192, 8192), (2048, 8192, 8192)),
        rhos=(0.0, 0.25, 0.5, 0.75, 1.0),
        reps=5,
    )


class Clock:
    """Seconds of device work between two points (CUDA events, or host time)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def time(self, fn: Callable[[], object], reps: int = 1, warmup: int = 1) -> float:
        for _ in range(warmup):
            fn()
        self.sync()
        samples = []
        for _ in range(reps):
            if self.cuda:
                start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(float(start.elapsed_time(end)) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - t0)
        return statistics.median(samples)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def _host(nbytes: int, *, fill: float | None = None) -> torch.Tensor:
    t = torch.empty(nbytes // 2, dtype=torch.bfloat16, pin_memory=torch.cuda.is_available())
    if fill is not None:
        t.fill_(fill)
    return t


def bandwidth_sweep(device: torch.device, sizes: Sizes, clock: Clock) -> list[dict[str, Any]]:
    """One contiguous copy of each size: D2H, H2D, and both at once."""
    rows = []
    for nbytes in sizes.sweep_bytes:
        dev_a = torch.randn(nbytes // 2, device=device).to(torch.bfloat16)
        dev_b = torch.empty_like(dev_a)
        host_a, host_b = _host(nbytes, fill=1.0), _host(nbytes)
        reps = sizes.reps if nbytes >= 16 * MiB else sizes.reps * 4
        d2h = clock.time(partial(host_b.copy_, dev_a, non_blocking=True), reps)
        h2d = clock.time(partial(dev_b.copy_, host_a, non_blocking=True), reps)
        both = clock.time(partial(_both, dev_a, host_b, dev_b, host_a), reps)
        rows.append(
            {
                "size_bytes": nbytes,
                "d2h_gbps": nbytes / d2h / GB,
                "h2d_gbps": nbytes / h2d / GB,
                "duplex_d2h_gbps": nbytes / both / GB,
                "duplex_h2d_gbps": nbytes / both / GB,
            }
        )
    return rows


def _both(
    dev_src: torch.Tensor, host_dst: torch.Tensor, dev_dst: torch.Tensor, host_src: torch.Tensor
) -> None:
    if dev_src.device.type != "cuda":
        host_dst.copy_(dev_src)
        dev_dst.copy_(host_src)
        return
    cur = torch.cuda.current_stream()
    s1 = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    s2 = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    s1.wait_stream(cur)
    s2.wait_stream(cur)
    with torch.cuda.stream(s1):
        host_dst.copy_(dev_src, non_blocking=True)
    with torch.cuda.stream(s2):
        dev_dst.copy_(host_src, non_blocking=True)
    cur.wait_stream(s1)
    cur.wait_stream(s2)


def _scattered(n: int, pool: int, gen: torch.Generator) -> list[int]:
    """n distinct ids of a pool of 2n, in random order, none adjacent-merged
    by chance more than a real allocator would."""
    return torch.randperm(pool, generator=gen)[:n].tolist()


def table1(device: torch.device, sizes: Sizes, clock: Clock) -> dict[str, Any]:
    """Swap n blocks out and n other blocks in (race-free: distinct GPU ids)."""
    n = sizes.table1_blocks
    shape = sizes.table1.with_blocks(2 * n)
    dtype = torch.bfloat16
    gpu = allocate(shape, KVLayout.BLOCK_FIRST, dtype=dtype, device=device)
    gpu.uniform_(-1.0, 1.0)
    cpu = allocate(shape, KVLayout.BLOCK_FIRST, dtype=dtype, pin=True, fill=0.5)
    block_bytes = shape.block_elems * 2
    gen = torch.Generator().manual_seed(0)
    gpu_ids = _scattered(2 * n, 2 * n, gen)
    cpu_ids = _scattered(2 * n, 2 * n, gen)
    d2h = make_batch(CopyDirection.D2H, zip(gpu_ids[:n], cpu_ids[:n], strict=True), block_bytes)
    h2d = make_batch(CopyDirection.H2D, zip(cpu_ids[n:], gpu_ids[n:], strict=True), block_bytes)
    moved = n * block_bytes
    out: dict[str, Any] = {
        "blocks_per_direction": n,
        "block_bytes": block_bytes,
        "segment_bytes": shape.segment_elems * 2,
        "bytes_per_direction": moved,
        "extents_per_direction": [len(d2h.extents), len(h2d.extents)],
        "methods": {},
    }

    def record(name: str, seconds: float, serial: tuple[float, float] | None, **extra: Any) -> None:
        row: dict[str, Any] = {"e2e_ms": seconds * 1e3, **extra}
        if serial is not None:
            row["d2h_gbps"] = moved / serial[0] / GB
            row["h2d_gbps"] = moved / serial[1] / GB
        else:
            row["d2h_gbps"] = row["h2d_gbps"] = moved / seconds / GB
        out["methods"][name] = row

    # Naive: one copy per (layer, K/V, block) segment of a layer-first cache,
    # on a subset of the blocks (hundreds of thousands of launches otherwise).
    k = min(sizes.naive_blocks, n)
    lf_gpu, lf_cpu = to_layer_first(gpu[: 2 * k]), to_layer_first(cpu[: 2 * k])
    sub_out = make_batch(CopyDirection.D2H, ((i, i) for i in range(k)))
    sub_in = make_batch(CopyDirection.H2D, ((i, k + i) for i in range(k)))
    t_out = clock.time(lambda: copy_per_segment(lf_gpu, lf_cpu, KVLayout.LAYER_FIRST, sub_out))
    t_in = clock.time(lambda: copy_per_segment(lf_cpu, lf_gpu, KVLayout.LAYER_FIRST, sub_in))
    scale = n / k
    record(
        "naive_per_segment",
        (t_out + t_in) * scale,
        (t_out * scale, t_in * scale),
        measured_blocks=k,
    )

    # MS: block-first, still one copy per block.
    t_out = clock.time(lambda: copy_per_block(gpu, cpu, d2h))
    t_in = clock.time(lambda: copy_per_block(cpu, gpu, h2d))
    record("ms_per_block", t_out + t_in, (t_out, t_in))

    methods = [Method.TRITON] if can_run(gpu, cpu) else []
    if device.type == "cuda":
        if memcpy_batch_available():
            methods.insert(0, Method.MEMCPY_BATCH)
    else:
        methods.insert(0, Method.REFERENCE)
    for method in methods:
        serial = DuplexEngine(gpu, cpu, method=method, duplex=False)
        t_out = clock.time(partial(_run, serial, [d2h]))
        t_in = clock.time(partial(_run, serial, [h2d]))
        both_serial = clock.time(partial(_run, serial, [d2h, h2d]))
        record(f"ms_mk_{method.value}", both_serial, (t_out, t_in))
        duplex = DuplexEngine(gpu, cpu, method=method, duplex=True)
        t_duplex = clock.time(partial(_run, duplex, [d2h, h2d]))
        record(f"duplex_{method.value}", t_duplex, None)
    best_one_way = (
        max(
            (m["d2h_gbps"] + m["h2d_gbps"]) / 2
            for k_, m in out["methods"].items()
            if k_.startswith("ms_mk")
        )
        if methods
        else 0.0
    )
    out["best_batched_one_way_gbps"] = best_one_way
    return out


def _run(engine: DuplexEngine, batches: list[TransferBatch]) -> None:
    """Submit, and order the current stream after both directions (so the
    timer's end event follows the copies)."""
    handle = engine.submit(batches)
    handle.wait(torch.cuda.current_stream() if engine.on_cuda else None)


def gemm_candidates(m: int, cuda: bool) -> tuple[list[Tiles], list[Tiles]]:
    """Tile shapes tried for each path: (output-stationary, weight-stationary)."""
    if not cuda:
        return [Tiles(16, 16, 16)], [Tiles(16, 16, 16), Tiles(16, 16, 32)]
    if m <= 16:
        sym = [Tiles(16, 32, 128, 4, 4), Tiles(16, 64, 128, 4, 4), Tiles(16, 64, 64, 4, 4)]
        ws = [Tiles(16, 32, 128, 4, 4), Tiles(16, 32, 256, 4, 3), Tiles(16, 64, 256, 4, 3)]
        return sym, ws
    sym = [Tiles(64, 64, 64), Tiles(64, 128, 64, 4, 3), Tiles(128, 128, 64, 8, 3),
           Tiles(128, 256, 64, 8, 3)]  # fmt: skip
    ws = [Tiles(64, 64, 64), Tiles(64, 64, 256, 4, 3), Tiles(128, 64, 256, 8, 3),
          Tiles(128, 128, 128, 8, 3), Tiles(64, 128, 256, 8, 3)]  # fmt: skip
    return sym, ws


def hybrid(device: torch.device, sizes: Sizes, clock: Clock) -> list[dict[str, Any]]:
    """Per shape and home of W: the fastest tiles of each path (pure rho 1 and
    rho 0), then every rho with those tiles, against torch matmul."""
    from triton.runtime.errors import OutOfResources  # noqa: PLC0415 - triton is optional

    from planner.kernels.triton_gemm import hybrid_gemm  # noqa: PLC0415 - triton is optional

    rows = []
    dtype = torch.bfloat16
    cuda = device.type == "cuda"
    for m, k, n in sizes.gemm_shapes:
        x = torch.randn(m, k, device=device).to(dtype)
        w = (torch.randn(k, n, device=device) / k**0.5).to(dtype)
        homes = {"hbm": w}
        if cuda:
            homes["host_mapped"] = w.cpu().pin_memory()
        if not can_run(x):
            break  # CPU without the Triton interpreter
        ref = hybrid_gemm_reference(x, w)
        t_torch = clock.time(partial(torch.matmul, x, w), sizes.reps)
        sym_tiles, ws_tiles = gemm_candidates(m, cuda)
        for home, wt in homes.items():
            tried = {}
            for rho, candidates in ((1.0, sym_tiles), (0.0, ws_tiles)):
                for tile in candidates:
                    run = partial(hybrid_gemm, x, wt, rho, tiles=tile, ws_tiles=tile)
                    try:
                        tried[(rho, tile)] = clock.time(run, sizes.reps)
                    except OutOfResources:
                        tried[(rho, tile)] = math.inf  # does not fit the device
            sym = min(sym_tiles, key=lambda t: tried[(1.0, t)])
            ws = min(ws_tiles, key=lambda t: tried[(0.0, t)])
            naive = Tiles(16 if m <= 16 else 64, 64, 64)
            for rho in sizes.rhos:
                gemm = partial(hybrid_gemm, x, wt, rho, tiles=sym, ws_tiles=ws)
                y = gemm()
                err = float((y.float() - ref.float()).abs().max())
                t = clock.time(gemm, sizes.reps)
                t_naive = clock.time(
                    partial(hybrid_gemm, x, wt, rho, tiles=naive, ws_tiles=naive), sizes.reps
                )
                rows.append(
                    {
                        "m": m, "k": k, "n": n, "w": home, "rho": rho,
                        "ms": t * 1e3, "one_tile_ms": t_naive * 1e3,
                        "torch_hbm_ms": t_torch * 1e3,
                        "tflops": 2 * m * n * k / t / 1e12, "max_abs_err": err,
                        "sym_tiles": asdict(sym), "ws_tiles": asdict(ws),
                        "tried_ms": {
                            f"{'sym' if r == 1.0 else 'ws'} {asdict(tl)}": (
                                v * 1e3 if math.isfinite(v) else None
                            )
                            for (r, tl), v in tried.items()
                        },
                    }
                )  # fmt: skip
    return rows


def checks(device: torch.device) -> dict[str, str]:
    """Every kernel against its reference on this device."""

    out: dict[str, str] = {}

    def check(name: str, fn: Callable[[], bool]) -> None:
        try:
            out[name] = "ok" if fn() else "MISMATCH"
        except Exception as exc:  # a benchmark reports, it does not stop
            out[name] = f"error: {type(exc).__name__}: {exc}"

    shape = KVShape(3, 12, 4, 2, 8)
    gpu = allocate(shape, KVLayout.BLOCK_FIRST, device=device)
    gpu.copy_(torch.randn(gpu.shape))
    cpu = allocate(shape, KVLayout.BLOCK_FIRST, pin=True, fill=0.0)
    batch = make_batch(CopyDirection.D2H, [(0, 3), (1, 4), (7, 0), (11, 11)])

    def blocks(method: Method) -> bool:
        want = cpu.clone()
        run_batch_reference(gpu, want, batch)
        got = cpu.clone().pin_memory() if device.type == "cuda" else cpu.clone()
        DuplexEngine(gpu, got, method=method).submit([batch]).wait()
        return torch.equal(got, want)

    methods = [Method.REFERENCE, Method.PER_EXTENT]
    if can_run(gpu, cpu):
        methods.append(Method.TRITON)
    if device.type == "cuda" and memcpy_batch_available():
        methods.append(Method.MEMCPY_BATCH)
    for method in methods:
        check(f"blocks_{method.value}", partial(blocks, method))

    def packed() -> bool:
        from planner.kernels.triton_pack import gather  # noqa: PLC0415 - triton is optional

        ts = [torch.randn(s, device=device) for s in (3, 700, 64)]
        lay = pack_layout(ts)
        a = torch.zeros(lay.total, device=device)
        b = torch.zeros(lay.total, device=device)
        gather(ts, a, lay)
        gather_reference(ts, b, lay)
        return torch.equal(a, b)

    if can_run(gpu):
        check("pack_gather", packed)

    def e2e(method: Method) -> bool:
        model = TinyTransformer(TinyConfig(), seed=0, device=device)
        prompts = {"a": [1, 2, 3, 4, 5], "b": [7, 8], "c": [9, 10, 11]}
        ev = [RotationEvent(3, swap_out=("a",)), RotationEvent(6, swap_out=("b",), swap_in=("a",)),
              RotationEvent(8, swap_in=("b",))]  # fmt: skip
        base = run_decode(model, prompts, 10, ev, rotate=False)
        rot = run_decode(model, prompts, 10, ev, method=method, gpu_blocks=16)
        return rot.tokens == base.tokens and all(
            torch.equal(torch.stack(rot.logits[r]), torch.stack(base.logits[r])) for r in prompts
        )

    for method in methods:
        check(f"e2e_{method.value}", partial(e2e, method))
    return out


def compute_facts(device: torch.device, clock: Clock, smoke: bool) -> dict[str, float]:
    """Achieved bf16 matmul TFLOP/s and device-memory copy GB/s (read + write)."""
    n = 256 if smoke else 8192
    a = torch.randn(n, n, device=device).to(torch.bfloat16)
    b = torch.randn(n, n, device=device).to(torch.bfloat16)
    t = clock.time(partial(torch.matmul, a, b), 1 if smoke else 10)
    nbytes = (1 << 20) if smoke else (1 << 30)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t_copy = clock.time(partial(dst.copy_, src), 1 if smoke else 10)
    return {"bf16_tflops": 2 * n**3 / t / 1e12, "hbm_gbps": 2 * nbytes / t_copy / GB}


def profile_json(
    device: torch.device,
    sweep: list[dict[str, Any]],
    facts: dict[str, float],
    smoke: bool,
) -> dict[str, Any]:
    """The measurements as a ``planner-profile/1`` file. Peak compute and HBM
    bandwidth are the achieved ones, so their efficiencies are 1."""
    big = [r for r in sweep if r["size_bytes"] >= 4 * MiB] or sweep[-1:]
    one_way = statistics.mean(r["d2h_gbps"] + r["h2d_gbps"] for r in big) / 2
    both = statistics.mean(r["duplex_d2h_gbps"] + r["duplex_h2d_gbps"] for r in big)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name, hbm = props.name, int(props.total_memory)
    else:
        name, hbm = f"cpu ({platform.machine()})", 1 << 30
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "format": "planner-profile/1",
        "name": ("smoke-" if smoke else "") + name.lower().replace(" ", "-"),
        "description": "Measured by planner.bench.kernels_gpu"
        + (" in smoke mode (tiny sizes; not a real measurement)" if smoke else ""),
        "provenance": {
            "kind": "measured",
            "tool": "python -m planner.bench.kernels_gpu" + (" --smoke" if smoke else ""),
            "device": name,
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
        },
        "hardware": {
            "name": name,
            "hbm_bytes": hbm,
            "host_memory_bytes": host,
            "peak_bf16_tflops": facts["bf16_tflops"],
            "hbm_gbps": facts["hbm_gbps"],
            "gemm_efficiency": 1.0,
            "hbm_efficiency": 1.0,
            "source": "achieved bf16 matmul and device copy rates",
        },
        "link": {
            "name": "measured copy engine",
            "h2d": {
                "points": [{"size_bytes": r["size_bytes"], "gbps": r["h2d_gbps"]} for r in sweep]
            },
            "d2h": {
                "points": [{"size_bytes": r["size_bytes"], "gbps": r["d2h_gbps"]} for r in sweep]
            },
            "full_duplex": both >= 1.3 * one_way,
            "duplex_points": [
                {
                    "size_bytes": r["size_bytes"],
                    "h2d_gbps": r["duplex_h2d_gbps"],
                    "d2h_gbps": r["duplex_d2h_gbps"],
                }
                for r in sweep
            ],
        },
    }


def targets(sweep: list[dict[str, Any]], t1: dict[str, Any]) -> dict[str, Any]:
    """Issue 8's targets, computed from the measurements."""
    peak = max(max(r["d2h_gbps"], r["h2d_gbps"]) for r in sweep)
    ms = t1["methods"]
    batched = [v for k, v in ms.items() if k.startswith("ms_mk")]
    duplex = [v for k, v in ms.items() if k.startswith("duplex")]
    naive = ms["naive_per_segment"]
    out: dict[str, Any] = {"copy_engine_peak_gbps": peak}
    if batched:
        best = max(batched, key=lambda v: min(v["d2h_gbps"], v["h2d_gbps"]))
        out["batched_fraction_of_peak"] = min(best["d2h_gbps"], best["h2d_gbps"]) / peak
        out["batched_over_naive"] = naive["e2e_ms"] / best["e2e_ms"]
    if duplex and batched:
        d = min(duplex, key=lambda v: v["e2e_ms"])
        one = max(min(v["d2h_gbps"], v["h2d_gbps"]) for v in batched)
        out["duplex_aggregate_over_one_direction"] = (d["d2h_gbps"] + d["h2d_gbps"]) / one
        out["duplex_over_naive"] = naive["e2e_ms"] / d["e2e_ms"]
    out["goals"] = {"batched_fraction_of_peak": 0.9, "duplex_aggregate_over_one_direction": 1.7,
                    "over_naive": 10.0}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "out/kernels"))
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, any device")
    parser.add_argument("--skip-gemm", action="store_true")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        print("no CUDA device: run with --smoke for the CPU smoke mode", file=sys.stderr)
        return 2
    device = torch.device("cuda" if cuda else "cpu")
    sizes = SMOKE if args.smoke else full_sizes(device)
    clock = Clock(device)
    t0 = time.perf_counter()
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "smoke": args.smoke,
        "checks": checks(device),
    }
    sweep = bandwidth_sweep(device, sizes, clock)
    report["bandwidth"] = sweep
    t1 = table1(device, sizes, clock)
    report["table1"] = t1
    if not args.skip_gemm:
        report["hybrid_gemm"] = hybrid(device, sizes, clock)
    report["targets"] = targets(sweep, t1)
    report["seconds"] = time.perf_counter() - t0
    facts = compute_facts(device, clock, args.smoke)
    report["compute"] = facts
    profile = profile_json(device, sweep, facts, args.smoke)

    loads_profile(json.dumps(profile))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernels.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "profile.json").write_text(json.dumps(profile, indent=2) + "\n")
    bad = {k: v for k, v in report["checks"].items() if v != "ok"}
    print(
        json.dumps(
            {"out": str(args.out), "checks_failed": bad, "targets": report["targets"]}, indent=2
        )
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
