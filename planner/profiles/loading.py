"""Measured profiles: a JSON file that describes one machine (hardware facts
and its CPU-GPU link, measured) and optionally measured cost-model constants
for some models on it. The kernels' benchmark writes one from a real GPU;
``planner replay`` and ``planner profiles show FILE`` read it.

Format ``planner-profile/1`` (every field is checked; unknown fields are
rejected; ``load_profile`` raises :class:`ProfileError` naming the field, e.g.
``link.h2d.points[2].gbps: must be > 0``)::

    {
      "format": "planner-profile/1",                      required, exactly this
      "name": "gh200-lab-a",                               required, non-empty
      "description": "free text",                          optional
      "provenance": {                                      optional
        "kind": "measured" | "hand-written" | "built-in",  required in provenance
        "source": "...", "tool": "...", "method": "...",   optional strings: where,
        "device": "...", "date": "..."                     with what, how, on what, when
      },
      "hardware": {                                        required
        "name": "gh200-144gb",                             required
        "hbm_bytes": 144000000000,                         integer > 0
        "host_memory_bytes": 480000000000,                 integer >= 0
        "peak_bf16_tflops": 989.4,                         number > 0 (dense)
        "hbm_gbps": 4900.0,                                number > 0 (GB/s = 1e9 B/s)
        "nvlink_gbps": 900.0,                              optional, >= 0 (GPU-GPU; 0 = none)
        "gemm_efficiency": 0.65,                           optional, in (0, 1]
        "hbm_efficiency": 0.8,                             optional, in (0, 1]
        "attention_efficiency": 0.5,                       optional, in (0, 1]
        "source": "..."                                    optional
      },
      "link": {                                            required
        "name": "NVLink-C2C",                              optional
        "h2d": CURVE, "d2h": CURVE,                        required: one direction alone
        "full_duplex": true,                               required
        "shared_cap_gbps": 384.0,                          optional: both directions' sum <= this
        "link_peak_gbps": 450.0,                           optional: per-direction ceiling
        "duplex_points": [                                 optional: measured with both busy
          {"size_bytes": 8388608, "h2d_gbps": 192.0, "d2h_gbps": 191.0}, ...
        ]                                                  sizes strictly increasing
      },
      "models": [MODEL, ...],                              optional: models not built in
      "cost": [                                            optional: measured constants
        {"model": "llama-3-8b", "tensor_parallel": 1,      model: built-in or in "models"
         "overhead_s": 0.0004, "decode_s_per_token": 2.1e-5, ...,
         "request_latency_s": 0.011,                      optional, >= 0: client-side
                                                           latency beyond the iterations
         "admission_s_per_request": 0.003,                optional, >= 0: serial
                                                           per-request work ahead of it
         "stream_s_per_token": 0.0003,                    optional, >= 0: the same
                                                           server's work per streamed token
         "stream_s_per_step": 0.0015,                     optional, >= 0: and per engine
                                                           step whose tokens it streams
         "tokenize_s_per_prompt_token": 2e-6,             optional, >= 0: the same
                                                           server's work per prompt token
                                                           after it takes a request up
         "planning_s_per_call": 0.0008,                   optional, >= 0: the engine's
                                                           time per call to its planner
         "step_jitter_cv": 0.2,                           optional, >= 0: measured spread
                                                           of the engine's step times
         "notes": "..."}                                   any subset of the seven constants;
                                                           notes: how they were obtained
      ]
    }

    CURVE = {"peak_gbps": 270.0, "half_size_bytes": 1835008}       saturating fit, or
            {"points": [{"size_bytes": 65536, "gbps": 9.9}, ...]}   measured, sizes increasing

    MODEL = {"name", "num_layers", "num_kv_heads", "head_dim", "hidden_size",
             "intermediate_size", "num_attention_heads", "vocab_size": integers > 0;
             optional: "kv_dtype_bytes" (2), "weight_dtype_bytes" (2),
             "num_experts" (1), "experts_per_token" (1), "qkv_bias" (false),
             "tie_word_embeddings" (false), "param_bytes" (counted), "source"}

The seven cost constants (seconds; :mod:`planner.profiles.cost`): ``overhead_s``,
``weights_floor_s``, ``prefill_s_per_token``, ``decode_s_per_token``,
``attn_s_per_context_token``, ``prefill_attn_s_per_pair``,
``prefill_s_per_sequence`` (per sequence an iteration prefills; derived 0).
Those a cost entry gives replace the derived ones; the rest are derived from
the hardware facts.
``request_latency_s`` is not an iteration cost: it is what a client of the
measured engine waits beyond its iterations (HTTP, tokenization,
detokenization, streaming), which ``planner replay`` adds to every request's
latencies (0 when not given). ``admission_s_per_request`` is not one either:
the serving front end's per-request work (request setup, tokenization,
handing the request to the engine) that requests go through one at a time
before the engine sees them; ``planner replay`` models it as a queue in
front of the engine (0 when not given: no queue). ``stream_s_per_token`` is
that front end's work per output token it streams (detokenizing and sending
it): the same server serves both, so admissions wait behind the streaming of
the running requests' tokens (0 when not given). ``stream_s_per_step`` is
its work per engine step that emitted tokens (handling the step's output
batch, whatever the number of tokens in it; 0 when not given).
``tokenize_s_per_prompt_token`` is that server's work per prompt token once it
has taken a request up (tokenization and input processing): the request
goes back in line on the same server for it, behind whatever came in
meanwhile, and reaches the engine when it is done (0 when not given: it
reaches the engine when taken up). ``planning_s_per_call`` is what the
engine's scheduler spends per call to a planning policy (a planner plugin's
call, made in the engine's own process): ``planner replay`` adds it to each
iteration in which its scheduler asked its policy (0 when not given).
``step_jitter_cv`` is the measured coefficient of variation of the engine's
step times about the cost model (the lognormal of ``planner replay
--compute-jitter``, which takes it; not applied by itself).
The link's curve semantics are in :mod:`planner.profiles.link`. The loaded
hardware's ``h2d_gbps`` / ``d2h_gbps`` (what rotation uses) are the link's
large-transfer rates with both directions busy.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from planner.profiles.cost import COST_CONSTANT_NAMES, IterationCostModel
from planner.profiles.errors import ProfileError
from planner.profiles.hardware import (
    ATTENTION_EFFICIENCY,
    GEMM_EFFICIENCY,
    HBM_EFFICIENCY,
    HardwareProfile,
)
from planner.profiles.link import (
    Curve,
    DuplexPoint,
    LinkModel,
    MeasuredCurve,
    MeasuredPoint,
    SaturatingCurve,
)
from planner.profiles.models import MODEL_PROFILES, ModelProfile, find_model

FORMAT = "planner-profile/1"
PROVENANCE_KINDS = ("measured", "hand-written", "built-in")
PROVENANCE_FIELDS = ("source", "tool", "method", "device", "date")
# A cost entry's optional terms beyond the constants and the front end's
# latency, admission and streaming (each a number >= 0; module docstring).
EXTRA_TERMS = ("tokenize_s_per_prompt_token", "planning_s_per_call", "step_jitter_cv")


@dataclass(frozen=True)
class MeasuredProfile:
    """A loaded profile: one machine, its link, extra models and measured
    cost constants keyed by (model name, tensor_parallel)."""

    name: str
    hardware: HardwareProfile
    description: str = ""
    provenance: dict[str, str] = field(default_factory=dict)
    models: dict[str, ModelProfile] = field(default_factory=dict)
    cost: dict[tuple[str, int], dict[str, float]] = field(default_factory=dict)
    # Free text per cost entry (how the constants were obtained).
    cost_notes: dict[tuple[str, int], str] = field(default_factory=dict)
    # Client-side latency beyond the iterations, per cost entry.
    request_latency: dict[tuple[str, int], float] = field(default_factory=dict)
    # Serial per-request work in front of the engine, per cost entry.
    admission: dict[tuple[str, int], float] = field(default_factory=dict)
    # The same front end's work per streamed output token, per cost entry.
    streaming: dict[tuple[str, int], float] = field(default_factory=dict)
    # And per engine step whose tokens it streams, per cost entry.
    streaming_steps: dict[tuple[str, int], float] = field(default_factory=dict)
    # The other optional terms of a cost entry (EXTRA_TERMS), per entry.
    extra_terms: dict[tuple[str, int], dict[str, float]] = field(default_factory=dict)

    def find_model(self, name: str) -> ModelProfile | None:
        """A model of this file, else a built-in one (aliases allowed)."""
        return self.models.get(name) or find_model(name)

    def cost_model(self, model: str | ModelProfile, tensor_parallel: int = 1) -> IterationCostModel:
        """The cost model of ``model`` on this machine: derived from the
        hardware facts, with this file's measured constants on top."""
        if isinstance(model, str):
            found = self.find_model(model)
            if found is None:
                raise ProfileError("model", f"unknown model {model!r}")
            model = found
        derived = IterationCostModel.derive(model, self.hardware, tensor_parallel)
        measured = self.cost.get((model.name, tensor_parallel))
        return derived.with_constants(measured) if measured else derived

    def request_latency_s(self, model: str, tensor_parallel: int = 1) -> float:
        """The measured client-side latency of ``model`` (its profile name or
        an alias), 0 when the file gives none."""
        found = self.find_model(model)
        name = found.name if found is not None else model
        return self.request_latency.get((name, tensor_parallel), 0.0)

    def admission_s_per_request(self, model: str, tensor_parallel: int = 1) -> float:
        """The measured serial per-request work in front of the engine of
        ``model``, 0 when the file gives none."""
        found = self.find_model(model)
        name = found.name if found is not None else model
        return self.admission.get((name, tensor_parallel), 0.0)

    def stream_s_per_token(self, model: str, tensor_parallel: int = 1) -> float:
        """The measured front end's work per streamed output token of
        ``model``, 0 when the file gives none."""
        found = self.find_model(model)
        name = found.name if found is not None else model
        return self.streaming.get((name, tensor_parallel), 0.0)

    def stream_s_per_step(self, model: str, tensor_parallel: int = 1) -> float:
        """The measured front end's work per engine step whose output tokens
        it streams, of ``model``, 0 when the file gives none."""
        found = self.find_model(model)
        name = found.name if found is not None else model
        return self.streaming_steps.get((name, tensor_parallel), 0.0)

    def extra_term(self, term: str, model: str, tensor_parallel: int = 1) -> float:
        """The measured term (one of EXTRA_TERMS) of ``model``, 0 when the
        file gives none."""
        found = self.find_model(model)
        name = found.name if found is not None else model
        return self.extra_terms.get((name, tensor_parallel), {}).get(term, 0.0)


# --- Reading ------------------------------------------------------------------------


def load_profile(path: str | Path) -> MeasuredProfile:
    """Read and validate a ``planner-profile/1`` JSON file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError("$", f"cannot read {p}: {exc}") from None
    return loads_profile(text)


def loads_profile(text: str) -> MeasuredProfile:
    """Parse and validate a profile from a JSON string."""
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ProfileError(
            "$", f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    return profile_from_dict(doc)


def _reject_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not a number JSON allows", name, 0)


class _Fields:
    """One JSON object being read: typed getters that name the field on
    error, and a final check that nothing unknown is left."""

    def __init__(self, value: Any, path: str) -> None:
        if not isinstance(value, dict):
            raise ProfileError(path or "$", f"must be an object, got {_kind(value)}")
        self.d: dict[str, Any] = value
        self.path = path
        self.seen: set[str] = set()

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def has(self, key: str) -> bool:
        return key in self.d

    def raw(self, key: str, required: bool = True) -> Any:
        self.seen.add(key)
        if key not in self.d:
            if required:
                raise ProfileError(self.at(key), "required field is missing")
            return None
        return self.d[key]

    def string(self, key: str, required: bool = True, default: str = "") -> str:
        v = self.raw(key, required)
        if v is None and not required:
            return default
        if not isinstance(v, str):
            raise ProfileError(self.at(key), f"must be a string, got {_kind(v)}")
        return v

    def boolean(self, key: str, required: bool = True, default: bool = False) -> bool:
        v = self.raw(key, required)
        if v is None and not required:
            return default
        if not isinstance(v, bool):
            raise ProfileError(self.at(key), f"must be true or false, got {_kind(v)}")
        return v

    def integer(self, key: str, required: bool = True, default: int = 0, minimum: int = 1) -> int:
        v = self.raw(key, required)
        if v is None and not required:
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            raise ProfileError(self.at(key), f"must be an integer, got {_kind(v)}")
        if v < minimum:
            raise ProfileError(self.at(key), f"must be >= {minimum}, got {v}")
        return v

    def number(
        self,
        key: str,
        required: bool = True,
        default: float = 0.0,
        check: Callable[[float], bool] = lambda x: x > 0,
        expect: str = "> 0",
    ) -> float:
        v = self.raw(key, required)
        if v is None and not required:
            return default
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ProfileError(self.at(key), f"must be a number, got {_kind(v)}")
        x = float(v)
        if not math.isfinite(x) or not check(x):
            raise ProfileError(self.at(key), f"must be {expect}, got {v!r}")
        return x

    def fraction(self, key: str, default: float) -> float:
        return self.number(
            key, required=False, default=default, check=lambda x: 0 < x <= 1, expect="in (0, 1]"
        )

    def array(self, key: str, required: bool = True) -> list[Any]:
        v = self.raw(key, required)
        if v is None and not required:
            return []
        if not isinstance(v, list):
            raise ProfileError(self.at(key), f"must be an array, got {_kind(v)}")
        return v

    def done(self) -> None:
        unknown = sorted(set(self.d) - self.seen)
        if unknown:
            known = ", ".join(sorted(self.seen))
            raise ProfileError(self.at(unknown[0]), f"unknown field (known here: {known})")


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int | float):
        return f"the number {v!r}"
    if isinstance(v, str):
        return f"the string {v!r}"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def _non_negative(x: float) -> bool:
    return x >= 0


def profile_from_dict(doc: Any) -> MeasuredProfile:
    """Validate a decoded JSON document (see the module docstring)."""
    top = _Fields(doc, "")
    fmt = top.string("format")
    if fmt != FORMAT:
        raise ProfileError("format", f"must be {FORMAT!r}, got {fmt!r}")
    name = top.string("name")
    if not name.strip():
        raise ProfileError("name", "must not be empty")
    description = top.string("description", required=False)
    provenance = _provenance(top.raw("provenance", required=False))
    link = _link(_Fields(top.raw("link"), "link"))
    hardware = _hardware(_Fields(top.raw("hardware"), "hardware"), link)
    models = _models(top.array("models", required=False))
    entries = _cost_entries(top.array("cost", required=False), models, hardware)
    top.done()
    return MeasuredProfile(
        name=name,
        hardware=hardware,
        description=description,
        provenance=provenance,
        models=models,
        cost=entries.constants,
        cost_notes=entries.notes,
        request_latency=entries.request_latency,
        admission=entries.admission,
        streaming=entries.streaming,
        streaming_steps=entries.streaming_steps,
        extra_terms=entries.extra_terms,
    )


def _provenance(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    f = _Fields(value, "provenance")
    out = {"kind": f.string("kind")}
    if out["kind"] not in PROVENANCE_KINDS:
        raise ProfileError(
            "provenance.kind", f"must be one of {', '.join(PROVENANCE_KINDS)}; got {out['kind']!r}"
        )
    for key in PROVENANCE_FIELDS:
        if f.has(key):
            out[key] = f.string(key)
    f.done()
    return out


def _hardware(f: _Fields, link: LinkModel) -> HardwareProfile:
    name = f.string("name")
    if not name.strip():
        raise ProfileError(f.at("name"), "must not be empty")
    hw = HardwareProfile.from_link(
        name,
        hbm_bytes=f.integer("hbm_bytes"),
        link=link,
        host_memory_bytes=f.integer("host_memory_bytes", minimum=0),
        peak_bf16_tflops=f.number("peak_bf16_tflops"),
        hbm_gbps=f.number("hbm_gbps"),
        nvlink_gbps=f.number("nvlink_gbps", required=False, check=_non_negative, expect=">= 0"),
        gemm_efficiency=f.fraction("gemm_efficiency", GEMM_EFFICIENCY),
        hbm_efficiency=f.fraction("hbm_efficiency", HBM_EFFICIENCY),
        attention_efficiency=f.fraction("attention_efficiency", ATTENTION_EFFICIENCY),
        source=f.string("source", required=False),
    )
    f.done()
    return hw


def _curve(value: Any, path: str) -> Curve:
    f = _Fields(value, path)
    if f.has("points"):
        raw = f.array("points")
        if not raw:
            raise ProfileError(f.at("points"), "needs at least one point")
        points: list[MeasuredPoint] = []
        for i, item in enumerate(raw):
            pf = _Fields(item, f"{f.at('points')}[{i}]")
            size = pf.integer("size_bytes")
            if points and size <= points[-1].size_bytes:
                raise ProfileError(pf.at("size_bytes"), "sizes must be strictly increasing")
            points.append(MeasuredPoint(size, pf.number("gbps")))
            pf.done()
        f.done()
        return MeasuredCurve(tuple(points))
    if not f.has("peak_gbps"):
        raise ProfileError(path, "needs either points or peak_gbps (+ half_size_bytes)")
    curve = SaturatingCurve(
        f.number("peak_gbps"),
        f.number("half_size_bytes", required=False, check=_non_negative, expect=">= 0"),
    )
    f.done()
    return curve


def _link(f: _Fields) -> LinkModel:
    name = f.string("name", required=False, default="link")
    h2d = _curve(f.raw("h2d"), f.at("h2d"))
    d2h = _curve(f.raw("d2h"), f.at("d2h"))
    full_duplex = f.boolean("full_duplex")
    cap = f.number("shared_cap_gbps") if f.has("shared_cap_gbps") else None
    peak = f.number("link_peak_gbps") if f.has("link_peak_gbps") else None
    points: list[DuplexPoint] = []
    for i, item in enumerate(f.array("duplex_points", required=False)):
        pf = _Fields(item, f"{f.at('duplex_points')}[{i}]")
        size = pf.integer("size_bytes")
        if points and size <= points[-1].size_bytes:
            raise ProfileError(pf.at("size_bytes"), "sizes must be strictly increasing")
        points.append(DuplexPoint(size, pf.number("h2d_gbps"), pf.number("d2h_gbps")))
        pf.done()
    f.done()
    return LinkModel(
        name=name,
        h2d=h2d,
        d2h=d2h,
        full_duplex=full_duplex,
        shared_cap_gbps=cap,
        link_peak_gbps=peak,
        duplex_points=tuple(points),
    )


def _models(items: list[Any]) -> dict[str, ModelProfile]:
    out: dict[str, ModelProfile] = {}
    for i, item in enumerate(items):
        f = _Fields(item, f"models[{i}]")
        name = f.string("name")
        if not name.strip():
            raise ProfileError(f.at("name"), "must not be empty")
        if name in out:
            raise ProfileError(f.at("name"), f"{name!r} appears twice")
        if find_model(name) is not None:
            raise ProfileError(f.at("name"), f"{name!r} is a built-in model; use another name")
        num_layers = f.integer("num_layers")
        num_kv_heads = f.integer("num_kv_heads")
        head_dim = f.integer("head_dim")
        hidden_size = f.integer("hidden_size")
        intermediate_size = f.integer("intermediate_size")
        num_attention_heads = f.integer("num_attention_heads")
        vocab_size = f.integer("vocab_size")
        experts = f.integer("num_experts", required=False, default=1)
        per_token = f.integer("experts_per_token", required=False, default=1)
        if per_token > experts:
            raise ProfileError(
                f.at("experts_per_token"), f"must be <= num_experts ({experts}), got {per_token}"
            )
        model = ModelProfile(
            name=name,
            num_layers=num_layers,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            kv_dtype_bytes=f.integer("kv_dtype_bytes", required=False, default=2),
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_attention_heads=num_attention_heads,
            vocab_size=vocab_size,
            num_experts=experts,
            experts_per_token=per_token,
            qkv_bias=f.boolean("qkv_bias", required=False),
            tie_word_embeddings=f.boolean("tie_word_embeddings", required=False),
            weight_dtype_bytes=f.integer("weight_dtype_bytes", required=False, default=2),
            source=f.string("source", required=False),
        )
        given = f.integer("param_bytes", required=False, default=0)
        f.done()
        counted = model.param_count() * model.weight_dtype_bytes
        out[name] = replace(model, param_bytes=given or counted)
    return out


@dataclass(frozen=True, slots=True)
class _CostEntries:
    constants: dict[tuple[str, int], dict[str, float]]
    notes: dict[tuple[str, int], str]
    request_latency: dict[tuple[str, int], float]
    admission: dict[tuple[str, int], float]
    streaming: dict[tuple[str, int], float]
    streaming_steps: dict[tuple[str, int], float]
    extra_terms: dict[tuple[str, int], dict[str, float]]


def _cost_entries(
    items: list[Any], models: dict[str, ModelProfile], hardware: HardwareProfile
) -> _CostEntries:
    out: dict[tuple[str, int], dict[str, float]] = {}
    notes: dict[tuple[str, int], str] = {}
    latency: dict[tuple[str, int], float] = {}
    admission: dict[tuple[str, int], float] = {}
    streaming: dict[tuple[str, int], float] = {}
    streaming_steps: dict[tuple[str, int], float] = {}
    extra_terms: dict[tuple[str, int], dict[str, float]] = {}
    for i, item in enumerate(items):
        f = _Fields(item, f"cost[{i}]")
        name = f.string("model")
        model = models.get(name) or find_model(name)
        if model is None:
            known = ", ".join(sorted([*MODEL_PROFILES, *models]))
            raise ProfileError(f.at("model"), f"unknown model {name!r} (known: {known})")
        tp = f.integer("tensor_parallel", required=False, default=1)
        key = (model.name, tp)
        if key in out:
            raise ProfileError(f.at("model"), f"{model.name} at tensor_parallel={tp} appears twice")
        values = {
            k: f.number(k, check=_non_negative, expect=">= 0")
            for k in COST_CONSTANT_NAMES
            if f.has(k)
        }
        if not values:
            raise ProfileError(
                f"cost[{i}]", f"gives no constant (any of: {', '.join(COST_CONSTANT_NAMES)})"
            )
        if f.has("request_latency_s"):
            latency[key] = f.number("request_latency_s", check=_non_negative, expect=">= 0")
        if f.has("admission_s_per_request"):
            admission[key] = f.number("admission_s_per_request", check=_non_negative, expect=">= 0")
        if f.has("stream_s_per_token"):
            streaming[key] = f.number("stream_s_per_token", check=_non_negative, expect=">= 0")
        if f.has("stream_s_per_step"):
            streaming_steps[key] = f.number("stream_s_per_step", check=_non_negative, expect=">= 0")
        extras = {
            term: f.number(term, check=_non_negative, expect=">= 0")
            for term in EXTRA_TERMS
            if f.has(term)
        }
        if extras:
            extra_terms[key] = extras
        note = f.string("notes", required=False)
        f.done()
        try:
            IterationCostModel.derive(model, hardware, tp)
        except ProfileError as exc:
            where = f.at(exc.field) if exc.field == "tensor_parallel" else exc.field
            raise ProfileError(where, exc.reason) from None
        out[key] = values
        if note:
            notes[key] = note
    return _CostEntries(out, notes, latency, admission, streaming, streaming_steps, extra_terms)


# --- Writing ------------------------------------------------------------------------


def _curve_to_dict(curve: Curve) -> dict[str, Any]:
    if isinstance(curve, SaturatingCurve):
        return {"peak_gbps": curve.peak_gbps, "half_size_bytes": curve.half_size_bytes}
    return {"points": [{"size_bytes": p.size_bytes, "gbps": p.gbps} for p in curve.points]}


def link_to_dict(link: LinkModel) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": link.name,
        "h2d": _curve_to_dict(link.h2d),
        "d2h": _curve_to_dict(link.d2h),
        "full_duplex": link.full_duplex,
    }
    if link.shared_cap_gbps is not None:
        d["shared_cap_gbps"] = link.shared_cap_gbps
    if link.link_peak_gbps is not None:
        d["link_peak_gbps"] = link.link_peak_gbps
    if link.duplex_points:
        d["duplex_points"] = [
            {"size_bytes": p.size_bytes, "h2d_gbps": p.h2d_gbps, "d2h_gbps": p.d2h_gbps}
            for p in link.duplex_points
        ]
    return d


def hardware_to_dict(hw: HardwareProfile) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": hw.name,
        "hbm_bytes": hw.hbm_bytes,
        "host_memory_bytes": hw.host_memory_bytes,
        "peak_bf16_tflops": hw.peak_bf16_tflops,
        "hbm_gbps": hw.hbm_gbps,
        "nvlink_gbps": hw.nvlink_gbps,
        "gemm_efficiency": hw.gemm_efficiency,
        "hbm_efficiency": hw.hbm_efficiency,
        "attention_efficiency": hw.attention_efficiency,
    }
    if hw.source:
        d["source"] = hw.source
    return d


def model_to_dict(m: ModelProfile) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": m.name,
        "num_layers": m.num_layers,
        "num_kv_heads": m.num_kv_heads,
        "head_dim": m.head_dim,
        "hidden_size": m.hidden_size,
        "intermediate_size": m.intermediate_size,
        "num_attention_heads": m.num_attention_heads,
        "vocab_size": m.vocab_size,
        "kv_dtype_bytes": m.kv_dtype_bytes,
        "weight_dtype_bytes": m.weight_dtype_bytes,
        "num_experts": m.num_experts,
        "experts_per_token": m.experts_per_token,
        "qkv_bias": m.qkv_bias,
        "tie_word_embeddings": m.tie_word_embeddings,
        "param_bytes": m.param_bytes,
    }
    if m.source:
        d["source"] = m.source
    return d


def profile_to_dict(profile: MeasuredProfile) -> dict[str, Any]:
    hw = profile.hardware
    d: dict[str, Any] = {"format": FORMAT, "name": profile.name}
    if profile.description:
        d["description"] = profile.description
    if profile.provenance:
        d["provenance"] = dict(profile.provenance)
    d["hardware"] = hardware_to_dict(hw)
    d["link"] = link_to_dict(hw.link_model())
    if profile.models:
        d["models"] = [model_to_dict(m) for m in profile.models.values()]
    if profile.cost:
        d["cost"] = [
            {
                "model": model,
                "tensor_parallel": tp,
                **values,
                **(
                    {"request_latency_s": profile.request_latency[(model, tp)]}
                    if (model, tp) in profile.request_latency
                    else {}
                ),
                **(
                    {"admission_s_per_request": profile.admission[(model, tp)]}
                    if (model, tp) in profile.admission
                    else {}
                ),
                **(
                    {"stream_s_per_token": profile.streaming[(model, tp)]}
                    if (model, tp) in profile.streaming
                    else {}
                ),
                **(
                    {"stream_s_per_step": profile.streaming_steps[(model, tp)]}
                    if (model, tp) in profile.streaming_steps
                    else {}
                ),
                **profile.extra_terms.get((model, tp), {}),
                **(
                    {"notes": profile.cost_notes[(model, tp)]}
                    if (model, tp) in profile.cost_notes
                    else {}
                ),
            }
            for (model, tp), values in profile.cost.items()
        ]
    return d


def dumps_profile(profile: MeasuredProfile) -> str:
    return json.dumps(profile_to_dict(profile), indent=2) + "\n"


def save_profile(profile: MeasuredProfile, path: str | Path) -> None:
    """Write ``profile`` as ``planner-profile/1`` JSON (what load_profile reads)."""
    Path(path).write_text(dumps_profile(profile), encoding="utf-8")


def builtin_profile(hardware: HardwareProfile) -> MeasuredProfile:
    """A built-in hardware profile as a profile document (a template for a
    measured one)."""
    return MeasuredProfile(
        name=hardware.name,
        hardware=hardware,
        description="built-in profile from public specifications",
        provenance={"kind": "built-in", "source": hardware.source or "planner.profiles"},
    )
