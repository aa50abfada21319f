"""`planner profiles list|show`: the built-in model and hardware profiles, the
cost model of a model on a machine, and measured profile files.

    planner profiles list [--json]
    planner profiles policies [--json]             every registered policy, solver backend
    planner profiles show NAME [--json]            a model or a hardware profile
    planner profiles show MODEL@HARDWARE [--tp N]  cost-model constants, KV capacity
    planner profiles show FILE.json                a measured profile (validated)
    planner profiles show MODEL@FILE.json          a model on a measured machine

Exit codes: 0 shown, 2 unknown name or invalid file (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from planner.profiles import (
    HARDWARE_PROFILES,
    MODEL_PROFILES,
    HardwareProfile,
    IterationCostModel,
    MeasuredProfile,
    ModelProfile,
    ProfileError,
    find_hardware,
    find_model,
    load_profile,
)
from planner.profiles.cost import DEFAULT_BLOCK_SIZE_TOKENS, DEFAULT_GPU_MEMORY_UTILIZATION
from planner.profiles.link import KIB, MIB, LinkModel, SaturatingCurve
from planner.profiles.loading import builtin_profile, model_to_dict, profile_to_dict
from planner.replay.policy_registries import TOPOLOGY_POLICIES
from planner.solvers import SOLVER_BACKENDS, available_backends

EXIT_OK = 0
EXIT_BAD_INPUT = 2

# Transfer sizes the link tables show.
LINK_SIZES = (4 * KIB, 64 * KIB, 256 * KIB, 1 * MIB, 4 * MIB, 8 * MIB, 64 * MIB, 1024 * MIB)


class _BadInputError(Exception):
    pass


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "profiles",
        help="built-in model and hardware profiles, cost model, measured profile files",
        description="Model and hardware profiles from public specifications, the iteration "
        "cost model of a model on a machine, and measured profile files.",
    )
    sub = p.add_subparsers(dest="profiles_command", metavar="ACTION")
    lp = sub.add_parser("list", help="every built-in model and hardware profile")
    lp.add_argument("--json", action="store_true", help="machine-readable output")
    lp.set_defaults(func=run_list)
    pp = sub.add_parser(
        "policies",
        help="every registered policy of every replay topology, and the solver backends",
    )
    pp.add_argument("--json", action="store_true", help="machine-readable output")
    pp.set_defaults(func=run_policies)
    sp = sub.add_parser(
        "show",
        help="one profile: NAME, MODEL@HARDWARE, a JSON FILE, or MODEL@FILE",
        description="Show a model, a hardware profile, the cost model of MODEL@HARDWARE "
        "(HARDWARE may be a measured profile file), or a measured profile FILE.",
    )
    sp.add_argument("name", help="a model, a hardware profile, MODEL@HARDWARE, or a JSON file")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.add_argument(
        "--tp", "--tensor-parallel", dest="tp", type=int, default=1, help="tensor parallel size"
    )
    sp.add_argument(
        "--block-size",
        type=int,
        default=DEFAULT_BLOCK_SIZE_TOKENS,
        help=f"KV block size in tokens (default {DEFAULT_BLOCK_SIZE_TOKENS})",
    )
    sp.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=DEFAULT_GPU_MEMORY_UTILIZATION,
        help=f"share of HBM for weights + KV (default {DEFAULT_GPU_MEMORY_UTILIZATION})",
    )
    sp.set_defaults(func=run_show)
    p.set_defaults(func=lambda _args: _usage(p))


def _usage(p: argparse.ArgumentParser) -> int:
    p.print_help(sys.stderr)
    return EXIT_BAD_INPUT


def _console() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=max(console.width, 160))
    return console


def _fail(message: str) -> int:
    print(f"planner profiles: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _known() -> str:
    return (
        f"models: {', '.join(sorted(MODEL_PROFILES))}; "
        f"hardware: {', '.join(sorted(HARDWARE_PROFILES))}; "
        "or MODEL@HARDWARE, or a profile JSON file"
    )


# --- Formatting helpers -------------------------------------------------------------


def _gb(x: float) -> str:
    return f"{x / 1e9:,.1f}"


def _b(x: int | float) -> str:
    """Parameters in billions."""
    return f"{x / 1e9:.2f}"


def _size(n: float) -> str:
    if n >= 1024**3:
        return f"{n / 1024**3:g} GiB"
    if n >= 1024**2:
        return f"{n / 1024**2:g} MiB"
    if n >= 1024:
        return f"{n / 1024:g} KiB"
    return f"{n:g} B"


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f}"


def _us(s: float) -> str:
    return f"{s * 1e6:.3f}"


def _ns(s: float) -> str:
    return f"{s * 1e9:.3f}"


def _duplex(link: LinkModel) -> str:
    if not link.full_duplex:
        return "half (turns)"
    if link.shared_cap_gbps is not None:
        return f"full, sum <= {link.shared_cap_gbps:g}"
    return "full"


# --- list ---------------------------------------------------------------------------


def model_summary(m: ModelProfile) -> dict[str, Any]:
    return {
        **model_to_dict(m),
        "param_count": m.param_count(),
        "active_param_count": m.active_param_count(),
        "kv_bytes_per_token": m.kv_bytes_per_token(),
        "block_bytes_16": m.block_bytes(16),
        "segment_bytes_16": m.segment_bytes(16),
    }


def hardware_summary(h: HardwareProfile) -> dict[str, Any]:
    link = h.link_model()
    both = link.concurrent_gbps(8 * MIB, 8 * MIB)
    return {
        "name": h.name,
        "hbm_bytes": h.hbm_bytes,
        "hbm_gbps": h.hbm_gbps,
        "peak_bf16_tflops": h.peak_bf16_tflops,
        "host_memory_bytes": h.host_memory_bytes,
        "nvlink_gbps": h.nvlink_gbps,
        "link": link.name,
        "h2d_gbps": h.h2d_gbps,
        "d2h_gbps": h.d2h_gbps,
        "full_duplex": h.full_duplex,
        "swap_bytes_per_s": h.swap_bytes_per_s(),
        "h2d_gbps_64kib": link.gbps(64 * KIB, "h2d"),
        "d2h_gbps_64kib": link.gbps(64 * KIB, "d2h"),
        "both_gbps_8mib": list(both),
        "shared_cap_gbps": link.shared_cap_gbps,
        "source": h.source,
    }


def run_policies(args: argparse.Namespace) -> int:
    """The policy registries (planner.replay.policy_registries) and the
    solver backends (planner.solvers.SOLVER_BACKENDS), as they are."""
    policies = [
        {
            "topology": topology,
            "policy": entry.name,
            "summary": entry.summary,
            "served_by": entry.served_by or None,
        }
        for topology, registry in TOPOLOGY_POLICIES.items()
        for entry in registry.entries()
    ]
    present = set(available_backends())
    backends = [
        {
            "backend": name,
            "summary": spec.summary,
            "requires": spec.requires,
            "present": spec.backend in present,
        }
        for name, spec in SOLVER_BACKENDS.items()
    ]
    if args.json:
        print(json.dumps({"policies": policies, "solver_backends": backends}, indent=2))
        return EXIT_OK
    console = _console()
    pt = Table(title="Policies (planner replay --topology T --policy NAME)", title_justify="left")
    for col in ("topology", "policy", "what it does", "served by"):
        pt.add_column(col)
    for topology, registry in TOPOLOGY_POLICIES.items():
        for entry in registry.entries():
            pt.add_row(topology, entry.name, entry.summary, entry.served_by or "replay only")
    console.print(pt)
    bt = Table(title="Solver backends", title_justify="left")
    for col in ("backend", "what it is", "needs", "present"):
        bt.add_column(col)
    for name, spec in SOLVER_BACKENDS.items():
        here = "yes" if spec.backend in present else "no"
        bt.add_row(name, spec.summary, spec.requires or "-", here)
    console.print(bt)
    return EXIT_OK


def run_list(args: argparse.Namespace) -> int:
    models = [MODEL_PROFILES[k] for k in sorted(MODEL_PROFILES)]
    hardware = [HARDWARE_PROFILES[k] for k in sorted(HARDWARE_PROFILES)]
    if args.json:
        doc = {
            "models": [model_summary(m) for m in models],
            "hardware": [hardware_summary(h) for h in hardware],
        }
        print(json.dumps(doc, indent=2))
        return EXIT_OK
    console = _console()
    mt = Table(title="Models (bf16; from config.json)", title_justify="left")
    for col in ("name", "layers", "hidden", "heads q/kv", "head dim", "experts", "params B"):
        mt.add_column(col, justify="left" if col == "name" else "right")
    for col in ("active B", "weights GB", "KV/token KiB", "block(16) MiB"):
        mt.add_column(col, justify="right")
    for m in models:
        mt.add_row(
            m.name,
            str(m.num_layers),
            str(m.hidden_size),
            f"{m.num_attention_heads}/{m.num_kv_heads}",
            str(m.head_dim),
            f"top-{m.experts_per_token} of {m.num_experts}" if m.is_moe else "-",
            _b(m.param_count()),
            _b(m.active_param_count()),
            _gb(m.param_bytes),
            f"{m.kv_bytes_per_token() / 1024:g}",
            f"{m.block_bytes(16) / MIB:g}",
        )
    console.print(mt)
    ht = Table(title="Hardware (per GPU)", title_justify="left")
    ht.add_column("name")
    for col in ("HBM GB", "HBM TB/s", "bf16 TFLOP/s", "host GB", "link", "alone H2D/D2H GB/s"):
        ht.add_column(col, justify="right" if col != "link" else "left")
    for col in ("both busy GB/s", "64 KiB GB/s", "duplex"):
        ht.add_column(col, justify="right" if col != "duplex" else "left")
    for h in hardware:
        link = h.link_model()
        alone = link.large_transfer_gbps(both=False)
        small = (link.gbps(64 * KIB, "h2d"), link.gbps(64 * KIB, "d2h"))
        ht.add_row(
            h.name,
            _gb(h.hbm_bytes),
            f"{h.hbm_gbps / 1e3:.2f}",
            f"{h.peak_bf16_tflops:g}",
            _gb(h.host_memory_bytes),
            link.name,
            f"{alone[0]:g}/{alone[1]:g}",
            f"{h.h2d_gbps:g}+{h.d2h_gbps:g}",
            f"{small[0]:.1f}/{small[1]:.1f}",
            _duplex(link),
        )
    console.print(ht)
    console.print(
        "achievable fractions: GEMM 0.65 of peak, HBM 0.8, attention 0.5; "
        "`planner profiles show MODEL@HARDWARE` for the cost model"
    )
    return EXIT_OK


# --- show ---------------------------------------------------------------------------


def run_show(args: argparse.Namespace) -> int:
    try:
        return _show(args)
    except _BadInputError as exc:
        return _fail(str(exc))
    except ProfileError as exc:
        return _fail(str(exc))


def _looks_like_file(name: str) -> bool:
    return name.endswith(".json") or "/" in name or Path(name).is_file()


def _load(path: str) -> MeasuredProfile:
    try:
        return load_profile(path)
    except ProfileError as exc:
        raise _BadInputError(f"{path}: {exc}") from None


def _show(args: argparse.Namespace) -> int:
    name: str = args.name
    if "@" in name:
        left, right = name.split("@", 1)
        if _looks_like_file(right):
            profile = _load(right)
            model = profile.find_model(left)
            if model is None:
                known = ", ".join(sorted([*MODEL_PROFILES, *profile.models]))
                raise _BadInputError(f"unknown model {left!r} (known: {known})")
            cost = profile.cost_model(model, args.tp)
        else:
            model = find_model(left)
            hw = find_hardware(right)
            if model is None:
                raise _BadInputError(
                    f"unknown model {left!r} (known: {', '.join(sorted(MODEL_PROFILES))})"
                )
            if hw is None:
                raise _BadInputError(
                    f"unknown hardware {right!r} (known: {', '.join(sorted(HARDWARE_PROFILES))})"
                )
            cost = IterationCostModel.derive(model, hw, args.tp)
        return _show_cost(cost, args)
    if _looks_like_file(name):
        if not Path(name).is_file():
            raise _BadInputError(f"no such profile file {name!r}; known names: {_known()}")
        return _show_file(_load(name), args)
    model = find_model(name)
    if model is not None:
        return _show_model(model, args)
    hw = find_hardware(name)
    if hw is not None:
        return _show_hardware(builtin_profile(hw), args)
    raise _BadInputError(f"unknown profile {name!r} ({_known()})")


def _show_model(m: ModelProfile, args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps(model_summary(m), indent=2))
        return EXIT_OK
    console = _console()
    t = Table(title=f"Model {m.name}", title_justify="left", show_header=False)
    t.add_column("field")
    t.add_column("value", justify="right")
    rows: list[tuple[str, str]] = [
        ("source", m.source or "-"),
        ("layers", str(m.num_layers)),
        ("hidden size", str(m.hidden_size)),
        ("intermediate size", str(m.intermediate_size)),
        ("attention heads / KV heads", f"{m.num_attention_heads} / {m.num_kv_heads}"),
        ("head dim", str(m.head_dim)),
        ("vocab", str(m.vocab_size)),
        ("experts", f"top-{m.experts_per_token} of {m.num_experts}" if m.is_moe else "dense"),
        ("q/k/v bias, tied embeddings", f"{m.qkv_bias}, {m.tie_word_embeddings}"),
        ("parameters", f"{m.param_count():,}"),
        ("active parameters per token", f"{m.active_param_count():,}"),
        ("weight bytes (bf16)", f"{m.param_bytes:,}"),
        ("forward FLOPs per token", f"{m.forward_flops_per_token():,}"),
        ("attention FLOPs per (query, key) pair", f"{m.attention_flops_per_pair():,}"),
        ("KV bytes per token", f"{m.kv_bytes_per_token():,}"),
        (
            f"KV block ({args.block_size} tokens), all layers",
            f"{m.block_bytes(args.block_size):,}",
        ),
        ("  one layer's segment (layer-first)", f"{m.segment_bytes(args.block_size):,}"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
    console.print(_per_pair_table([m], list(HARDWARE_PROFILES.values()), args))
    return EXIT_OK


def _per_pair_table(
    models: list[ModelProfile],
    hardware: list[HardwareProfile],
    args: argparse.Namespace,
    profile: MeasuredProfile | None = None,
) -> Table:
    """One row per (model, hardware): derived constants, or with a measured
    profile's constants on top when ``profile`` is given."""
    t = Table(
        title=f"Cost model (tp={args.tp}; ms unless named)",
        title_justify="left",
    )
    for col in ("model", "hardware"):
        t.add_column(col)
    for col in (
        "c0",
        "weights floor",
        "per token µs",
        "attn ns/ctx tok",
        "decode b=1",
        "prefill 2K",
        f"KV blocks ({args.block_size})",
    ):
        t.add_column(col, justify="right")
    for m in models:
        for h in hardware:
            try:
                if profile is not None:
                    cost = profile.cost_model(m, args.tp)
                else:
                    cost = IterationCostModel.derive(m, h, args.tp)
            except ProfileError as exc:
                t.add_row(m.name, h.name, f"[dim]{exc.reason}[/dim]", *[""] * 6)
                continue
            c = cost.constants
            blocks = cost.kv_blocks(args.block_size, args.gpu_memory_utilization)
            t.add_row(
                m.name,
                h.name,
                _ms(c.overhead_s),
                _ms(c.weights_floor_s),
                _us(c.decode_s_per_token),
                _ns(c.attn_s_per_context_token),
                _ms(cost.decode_step_s(1, 1024)),
                _ms(cost.prefill_s(2048)),
                f"{blocks:,}" if blocks else "does not fit",
            )
    return t


def _link_table(link: LinkModel) -> Table:
    t = Table(title=f"Link {link.name}: GB/s by copy size", title_justify="left")
    t.add_column("copy size", justify="right")
    for col in ("H2D alone", "D2H alone", "H2D both", "D2H both", "sum both"):
        t.add_column(col, justify="right")
    for size in LINK_SIZES:
        h, d = link.gbps(size, "h2d"), link.gbps(size, "d2h")
        bh, bd = link.concurrent_gbps(size, size)
        t.add_row(
            _size(size),
            f"{h:.1f}",
            f"{d:.1f}",
            f"{bh:.1f}" if link.full_duplex else "turns",
            f"{bd:.1f}" if link.full_duplex else "turns",
            f"{bh + bd:.1f}" if link.full_duplex else "-",
        )
    return t


def _link_lines(link: LinkModel) -> list[str]:
    lines = [f"link {link.name}: {_duplex(link)} duplex"]
    for direction, curve in (("H2D", link.h2d), ("D2H", link.d2h)):
        if isinstance(curve, SaturatingCurve):
            lines.append(
                f"  {direction}: peak {curve.peak_gbps:g} GB/s, half at "
                f"{_size(curve.half_size_bytes)} (≈ {curve.latency_s() * 1e6:.1f} µs per copy)"
            )
        else:
            lines.append(f"  {direction}: {len(curve.points)} measured points")
    if link.link_peak_gbps is not None:
        lines.append(f"  link peak {link.link_peak_gbps:g} GB/s per direction")
    if link.duplex_points:
        lines.append(f"  measured both-busy points: {len(link.duplex_points)}")
    return lines


def _show_hardware(
    profile: MeasuredProfile, args: argparse.Namespace, measured: bool = False
) -> int:
    if args.json:
        print(json.dumps(profile_to_dict(profile), indent=2))
        return EXIT_OK
    h = profile.hardware
    console = _console()
    t = Table(title=f"Hardware {h.name}", title_justify="left", show_header=False)
    t.add_column("field")
    t.add_column("value", justify="right")
    for k, v in (
        ("source", h.source or "-"),
        ("HBM", f"{h.hbm_bytes:,} B"),
        ("HBM bandwidth", f"{h.hbm_gbps:g} GB/s (x {h.hbm_efficiency:g} achievable)"),
        (
            "bf16 dense peak",
            f"{h.peak_bf16_tflops:g} TFLOP/s (x {h.gemm_efficiency:g} GEMM, "
            f"x {h.attention_efficiency:g} attention)",
        ),
        ("host memory", f"{h.host_memory_bytes:,} B"),
        ("NVLink (GPU-GPU)", f"{h.nvlink_gbps:g} GB/s"),
        ("rotation rate (H2D + D2H, large)", f"{h.h2d_gbps:g} + {h.d2h_gbps:g} GB/s"),
        ("swap_bytes_per_s", f"{h.swap_bytes_per_s():.4g}"),
    ):
        t.add_row(k, v)
    console.print(t)
    link = h.link_model()
    for line in _link_lines(link):
        console.print(line)
    console.print(_link_table(link))
    models = [*MODEL_PROFILES.values(), *profile.models.values()]
    console.print(_per_pair_table(models, [h], args, profile if measured else None))
    return EXIT_OK


def _show_file(profile: MeasuredProfile, args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps(profile_to_dict(profile), indent=2))
        return EXIT_OK
    console = _console()
    console.print(f"[bold]profile {profile.name}[/bold]: {profile.description or '-'}")
    if profile.provenance:
        prov = ", ".join(f"{k}={v}" for k, v in profile.provenance.items())
        console.print(f"provenance: {prov}")
    _show_hardware(profile, args, measured=True)
    if profile.cost:
        t = Table(title="Measured cost constants (s)", title_justify="left")
        t.add_column("model")
        t.add_column("tp", justify="right")
        t.add_column("constant")
        t.add_column("measured", justify="right")
        t.add_column("derived", justify="right")
        for (model, tp), values in profile.cost.items():
            derived = profile.cost_model(model, tp)
            base = IterationCostModel.derive(derived.model, profile.hardware, tp).constants
            for k, v in values.items():
                t.add_row(model, str(tp), k, f"{v:.4g}", f"{getattr(base, k):.4g}")
        console.print(t)
    return EXIT_OK


def _show_cost(cost: IterationCostModel, args: argparse.Namespace) -> int:
    desc = cost.describe(args.block_size, args.gpu_memory_utilization)
    if args.json:
        print(json.dumps(desc, indent=2))
        return EXIT_OK
    console = _console()
    c = cost.constants
    measured = cost.measured
    base = IterationCostModel.derive(cost.model, cost.hardware, cost.tensor_parallel).constants
    console.print(
        f"[bold]{cost.model.name} @ {cost.hardware.name}[/bold], "
        f"tensor_parallel={cost.tensor_parallel}"
    )
    console.print(
        "t = c0 + max(W(P+D), c_prefill*P + c_decode*D) + c_attn*A + c_pair*Q   "
        "(P prefill tokens, D decode tokens, A attended context tokens, Q prefill pairs)"
    )
    t = Table(title="Constants", title_justify="left")
    t.add_column("constant")
    t.add_column("value", justify="right")
    t.add_column("from")
    inp = desc["inputs"]
    rows = (
        (
            "c0 overhead_s",
            _ms(c.overhead_s) + " ms",
            "200 µs + 8 µs/layer (+ TP all-reduce latency)",
        ),
        (
            "W weights_floor_s",
            _ms(c.weights_floor_s) + " ms",
            f"{inp['weights_read_bytes'] / cost.tensor_parallel:,.0f} B / "
            f"{inp['achievable_hbm_gbps']:g} GB/s",
        ),
        (
            "c_prefill prefill_s_per_token",
            _us(c.prefill_s_per_token) + " µs",
            f"{inp['forward_flops_per_token']:,} FLOP / {inp['achievable_gemm_tflops']:g} TFLOP/s",
        ),
        (
            "c_decode decode_s_per_token",
            _us(c.decode_s_per_token) + " µs",
            "same as c_prefill (derived)",
        ),
        (
            "c_attn attn_s_per_context_token",
            _ns(c.attn_s_per_context_token) + " ns",
            f"{inp['kv_bytes_per_token_per_gpu']:,} B KV / {inp['achievable_hbm_gbps']:g} GB/s",
        ),
        (
            "c_pair prefill_attn_s_per_pair",
            _ns(c.prefill_attn_s_per_pair) + " ns",
            f"{inp['attention_flops_per_pair']:,} FLOP / "
            f"{inp['achievable_attention_tflops']:g} TFLOP/s",
        ),
        (
            "c_seq prefill_s_per_sequence",
            _us(c.prefill_s_per_sequence) + " µs",
            "not derived (0): per prefilling sequence, measured only",
        ),
    )
    names = list(c.as_dict())
    for (label, value, src), n in zip(rows, names, strict=True):
        why = f"measured (derived: {getattr(base, n):.4g} s)" if n in measured else src
        t.add_row(label, value, why)
    console.print(t)
    console.print(
        f"ridge (memory- to compute-bound): {desc['ridge_tokens']:.0f} tokens per iteration"
    )
    ex = Table(title="Worked examples", title_justify="left")
    ex.add_column("iteration")
    ex.add_column("ms", justify="right")
    for k, v in desc["examples_s"].items():
        ex.add_row(k, _ms(v))
    console.print(ex)
    kv = desc["kv_capacity"]
    console.print(
        f"KV capacity at gpu_memory_utilization={kv['gpu_memory_utilization']:g}: "
        f"{kv['gpu_blocks']:,} blocks of {kv['block_size_tokens']} tokens "
        f"({kv['gpu_tokens']:,} tokens; {kv['block_bytes_per_gpu']:,} B per block per GPU) "
        f"after {kv['weight_bytes_per_gpu']:,} B of weights per GPU; "
        f"host: {kv['cpu_blocks']:,} blocks"
    )
    return EXIT_OK
