"""Measured profiles: the JSON format, strict validation, round trips."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from planner.profiles import (
    HARDWARE_PROFILES,
    MODEL_PROFILES,
    IterationCostModel,
    ProfileError,
    load_profile,
    save_profile,
)
from planner.profiles.loading import (
    builtin_profile,
    loads_profile,
    profile_from_dict,
    profile_to_dict,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURE = REPO_ROOT / "fixtures" / "profiles" / "gh200-144gb.handwritten.json"


def fixture_doc() -> dict:
    return json.loads(FIXTURE.read_text())


def test_the_fixture_loads_and_says_it_is_hand_written():
    p = load_profile(FIXTURE)
    assert p.provenance["kind"] == "hand-written"
    assert "NOT A MEASUREMENT" in p.description
    hw = p.hardware
    assert hw.name == "gh200-144gb" and hw.hbm_bytes == 144_000_000_000
    link = hw.link_model()
    # Table 1 rows at their copy sizes.
    assert link.gbps(65536, "h2d") == 9.86 and link.gbps(65536, "d2h") == 10.75
    assert link.gbps(4 * 1024**2, "d2h") == 80.05
    assert link.gbps(8 * 1024**3, "h2d") == 269.69
    # DuplexKV, both busy: the rotation rates.
    assert (hw.h2d_gbps, hw.d2h_gbps) == (179.37, 180.99)
    assert hw.swap_bytes_per_s() == 179.37e9
    assert link.concurrent_gbps(8 * 1024**3, 8 * 1024**3) == (179.37, 180.99)


def test_measured_constants_override_the_derived_ones():
    p = load_profile(FIXTURE)
    cost = p.cost_model("qwen2.5-32b")
    assert cost.measured == {"overhead_s"}
    assert cost.constants.overhead_s == 0.0007
    derived = IterationCostModel.derive(MODEL_PROFILES["qwen2.5-32b"], p.hardware)
    assert cost.constants.weights_floor_s == derived.constants.weights_floor_s
    # No measurement for another model or TP: derived only.
    assert p.cost_model("llama-3-8b").measured == frozenset()
    with pytest.raises(ProfileError):
        p.cost_model("no-such-model")


def test_round_trip(tmp_path):
    p = load_profile(FIXTURE)
    out = tmp_path / "p.json"
    save_profile(p, out)
    again = load_profile(out)
    assert again == p
    assert profile_to_dict(again) == profile_to_dict(p)


@pytest.mark.parametrize("name", sorted(HARDWARE_PROFILES))
def test_builtins_round_trip_through_the_format(name, tmp_path):
    hw = HARDWARE_PROFILES[name]
    out = tmp_path / f"{name}.json"
    save_profile(builtin_profile(hw), out)
    loaded = load_profile(out)
    assert loaded.hardware == hw
    assert loaded.provenance["kind"] == "built-in"


def test_a_model_defined_in_the_file():
    doc = fixture_doc()
    doc["models"] = [
        {
            "name": "tiny-1b",
            "num_layers": 16,
            "num_kv_heads": 8,
            "head_dim": 64,
            "hidden_size": 2048,
            "intermediate_size": 8192,
            "num_attention_heads": 32,
            "vocab_size": 128256,
            "tie_word_embeddings": True,
        }
    ]
    doc["cost"].append({"model": "tiny-1b", "decode_s_per_token": 1e-6})
    p = profile_from_dict(doc)
    m = p.models["tiny-1b"]
    assert m.param_count() == 1_235_814_400  # Llama-3.2-1B's shape
    assert m.param_bytes == 2 * 1_235_814_400
    assert p.cost_model("tiny-1b").constants.decode_s_per_token == 1e-6
    assert profile_from_dict(profile_to_dict(p)) == p


def _set(path: str, value: object):
    def mutate(doc: dict) -> None:
        *parents, last = _split(path)
        node = doc
        for key in parents:
            node = node[key]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value

    return mutate


def _split(path: str) -> list:
    """'a.b[2].c' -> ['a', 'b', 2, 'c']."""
    keys: list = []
    for part in path.replace("]", "").replace("[", ".").split("."):
        keys.append(int(part) if part.isdigit() else part)
    return keys


_DELETE = object()

BAD_FIELDS = [
    ("format", "planner-profile/0", "format", "must be 'planner-profile/1'"),
    ("name", _DELETE, "name", "required"),
    ("name", "  ", "name", "must not be empty"),
    ("extra", 1, "extra", "unknown field"),
    ("provenance.kind", "guessed", "provenance.kind", "must be one of"),
    ("provenance.date", 20240101, "provenance.date", "must be a string"),
    ("hardware", _DELETE, "hardware", "required"),
    ("hardware.hbm_bytes", -1, "hardware.hbm_bytes", "must be >= 1"),
    ("hardware.hbm_bytes", 1.5e11, "hardware.hbm_bytes", "must be an integer"),
    ("hardware.hbm_bytes", True, "hardware.hbm_bytes", "must be an integer"),
    ("hardware.host_memory_bytes", "480 GB", "hardware.host_memory_bytes", "must be an integer"),
    ("hardware.peak_bf16_tflops", 0, "hardware.peak_bf16_tflops", "must be > 0"),
    ("hardware.peak_bf16_tflops", "fast", "hardware.peak_bf16_tflops", "must be a number"),
    ("hardware.hbm_gbps", None, "hardware.hbm_gbps", "must be a number"),
    ("hardware.hbm_efficiency", 1.5, "hardware.hbm_efficiency", "in (0, 1]"),
    ("hardware.nvlink_gbps", -1, "hardware.nvlink_gbps", ">= 0"),
    ("hardware.bogus", 1, "hardware.bogus", "unknown field"),
    ("link", _DELETE, "link", "required"),
    ("link.full_duplex", _DELETE, "link.full_duplex", "required"),
    ("link.full_duplex", "yes", "link.full_duplex", "must be true or false"),
    ("link.h2d.points[1].gbps", 0, "link.h2d.points[1].gbps", "must be > 0"),
    ("link.h2d.points[2].size_bytes", 100, "link.h2d.points[2].size_bytes", "strictly increasing"),
    ("link.h2d.points[0].size_bytes", 0, "link.h2d.points[0].size_bytes", "must be >= 1"),
    ("link.h2d.points[0].extra", 0, "link.h2d.points[0].extra", "unknown field"),
    ("link.h2d.points", [], "link.h2d.points", "at least one point"),
    ("link.h2d.points", {}, "link.h2d.points", "must be an array"),
    ("link.d2h", {}, "link.d2h", "needs either points or peak_gbps"),
    ("link.d2h", {"peak_gbps": 10, "half_size_bytes": -1}, "link.d2h.half_size_bytes", ">= 0"),
    ("link.d2h", [], "link.d2h", "must be an object"),
    ("link.shared_cap_gbps", 0, "link.shared_cap_gbps", "must be > 0"),
    ("link.duplex_points[0].h2d_gbps", -1, "link.duplex_points[0].h2d_gbps", "must be > 0"),
    ("link.duplex_points[0].d2h_gbps", _DELETE, "link.duplex_points[0].d2h_gbps", "required"),
    ("cost[0].model", "gpt-5", "cost[0].model", "unknown model"),
    ("cost[0].overhead_s", -1, "cost[0].overhead_s", ">= 0"),
    ("cost[0].overhead_s", float("inf"), "cost[0].overhead_s", ">= 0"),
    ("cost[0].overhead_s", _DELETE, "cost[0]", "gives no constant"),
    ("cost[0].tensor_parallel", 3, "cost[0].tensor_parallel", "does not divide"),
    ("cost[0].tensor_parallel", 0, "cost[0].tensor_parallel", "must be >= 1"),
    ("cost[0].bogus_s", 1.0, "cost[0].bogus_s", "unknown field"),
    ("cost[0].request_latency_s", -0.01, "cost[0].request_latency_s", ">= 0"),
    ("cost[0].admission_s_per_request", -1e-3, "cost[0].admission_s_per_request", ">= 0"),
    ("cost[0].stream_s_per_token", -1e-4, "cost[0].stream_s_per_token", ">= 0"),
    ("cost[0].stream_s_per_step", -1e-4, "cost[0].stream_s_per_step", ">= 0"),
    ("cost[0].tokenize_s_per_prompt_token", -1e-6, "cost[0].tokenize_s_per_prompt_token", ">= 0"),
    ("cost[0].planning_s_per_call", "fast", "cost[0].planning_s_per_call", "number"),
    ("cost[0].step_jitter_cv", float("nan"), "cost[0].step_jitter_cv", ">= 0"),
    ("cost[0].notes", 3, "cost[0].notes", "must be a string"),
    ("provenance.method", ["probes"], "provenance.method", "must be a string"),
    ("cost", {}, "cost", "must be an array"),
    ("models", [{"name": "llama-3-8b"}], "models[0].name", "built-in model"),
    ("models", [{"name": "x", "num_layers": 2}], "models[0].num_kv_heads", "required"),
]


@pytest.mark.parametrize(("path", "value", "field", "reason"), BAD_FIELDS)
def test_each_bad_field_is_named(path, value, field, reason):
    doc = copy.deepcopy(fixture_doc())
    _set(path, value)(doc)
    with pytest.raises(ProfileError) as err:
        profile_from_dict(doc)
    assert err.value.field == field
    assert reason in err.value.reason
    assert str(err.value).startswith(f"{field}: ")


def test_duplicate_cost_entry():
    doc = fixture_doc()
    doc["cost"].append(dict(doc["cost"][0]))
    with pytest.raises(ProfileError) as err:
        profile_from_dict(doc)
    assert err.value.field == "cost[1].model"
    assert "twice" in err.value.reason


def test_not_json_not_an_object_missing_file(tmp_path):
    with pytest.raises(ProfileError) as err:
        loads_profile("{ not json")
    assert err.value.field == "$" and "not valid JSON" in err.value.reason
    with pytest.raises(ProfileError) as err:
        loads_profile('{"format": NaN}')
    assert err.value.field == "$"
    with pytest.raises(ProfileError) as err:
        loads_profile("[]")
    assert err.value.field == "$" and "must be an object" in err.value.reason
    with pytest.raises(ProfileError) as err:
        load_profile(tmp_path / "absent.json")
    assert err.value.field == "$" and "cannot read" in err.value.reason


def test_saturating_curve_form():
    doc = fixture_doc()
    doc["link"]["h2d"] = {"peak_gbps": 270.0, "half_size_bytes": 1835008}
    p = profile_from_dict(doc)
    assert p.hardware.link_model().gbps(1835008, "h2d") == pytest.approx(135.0)


def test_how_a_measurement_was_made_round_trips(tmp_path):
    doc = fixture_doc()
    doc["provenance"] = {
        "kind": "measured",
        "source": "http://127.0.0.1:8000 (served model m)",
        "tool": "planner profile 0.1.0",
        "method": "25 synthetic batches x 3 repeats",
        "device": "AMD EPYC, 2 CPUs",
        "date": "2026-11-25T21:00:00+00:00",
    }
    doc["cost"][0]["notes"] = "fit: median |relative error| 4.0 %"
    doc["cost"][0]["request_latency_s"] = 0.011
    doc["cost"][0]["admission_s_per_request"] = 0.0015
    doc["cost"][0]["stream_s_per_token"] = 0.0004
    doc["cost"][0]["stream_s_per_step"] = 0.0015
    doc["cost"][0]["tokenize_s_per_prompt_token"] = 2e-6
    doc["cost"][0]["planning_s_per_call"] = 0.0008
    doc["cost"][0]["step_jitter_cv"] = 0.25
    p = profile_from_dict(doc)
    assert p.extra_term("tokenize_s_per_prompt_token", "qwen2.5-32b") == 2e-6
    assert p.extra_term("planning_s_per_call", "qwen2.5-32b") == 0.0008
    assert p.extra_term("step_jitter_cv", "qwen2.5-32b") == 0.25
    assert p.extra_term("step_jitter_cv", "llama-3-8b") == 0.0
    assert p.request_latency_s("qwen2.5-32b") == 0.011
    assert p.request_latency_s("llama-3-8b") == 0.0
    assert p.admission_s_per_request("qwen2.5-32b") == 0.0015
    assert p.admission_s_per_request("llama-3-8b") == 0.0
    assert p.stream_s_per_token("qwen2.5-32b") == 0.0004
    assert p.stream_s_per_token("llama-3-8b") == 0.0
    assert p.stream_s_per_step("qwen2.5-32b") == 0.0015
    assert p.stream_s_per_step("llama-3-8b") == 0.0
    assert p.provenance["method"] == "25 synthetic batches x 3 repeats"
    key = next(iter(p.cost))
    assert p.cost_notes[key] == "fit: median |relative error| 4.0 %"
    path = tmp_path / "p.json"
    save_profile(p, path)
    again = load_profile(path)
    assert again.provenance == p.provenance
    assert again.cost_notes == p.cost_notes
    assert again.request_latency == p.request_latency
    assert again.admission == p.admission
    assert again.streaming == p.streaming
    assert again.streaming_steps == p.streaming_steps
    assert again.extra_terms == p.extra_terms
    assert profile_to_dict(again)["cost"][0]["notes"] == doc["cost"][0]["notes"]
