"""Fuzzing `planner call` (in process): text that is not JSON, JSON of the
wrong shape, valid requests with one value replaced (wrong types, unknown
fields, huge numbers, NaN), and bad --deadline-ms. Every run exits 0, 1 or
2 with one `planner call: ...` line on stderr, never a traceback; exit 2
names what is wrong."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner import cli

REPO_ROOT = Path(__file__).resolve().parents[2]
ROTATION = "RotationService.PlanRotation"
ROTATION_JSON = json.loads(
    (REPO_ROOT / "fixtures/rotation/example_request.json").read_text(encoding="utf-8")
)
# Valid requests of a few RPCs as proto3 JSON (int64 as strings, enums by name).
VALID: dict[str, dict[str, object]] = {
    ROTATION: ROTATION_JSON,
    "PlacementService.PartitionBatch": {
        "requests": [
            {"id": "A", "prompt_tokens": 32, "prefilled_tokens": 32, "generated_tokens": 4},
            {"id": "C", "prompt_tokens": 32, "arrival_s": 1.0},
        ],
        "token_budget": "64",
        "gpu_blocks": "100",
    },
    "ServerlessService.ChooseChunkSize": {
        "slice": {"id": "a", "profile_name": "7"},
        "ttft_target_s": 1.0,
        "table": [{"chunk_tokens": 512, "ttft_s": 1.5}, {"chunk_tokens": 1024, "ttft_s": 1.0}],
    },
    "PlacementService.OfferMemory": {
        "pool_id": "p",
        "idempotency_key": "k",
        "producer_id": "gpu0",
        "bytes": "1000",
    },
}
EXAMPLES = 100

JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-0", "", "x" * 300, "12abc"]),
    st.text(max_size=8),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
# Numbers json.dumps cannot write: spliced into the text as they are.
RAW_NUMBERS = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1e400",
    "99999999999999999999999",
    "-1e-400",
    "0x10",
]


def run_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], method: str, text: str, *extra: str
) -> tuple[int, str]:
    path = tmp_path / "request.json"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    code = cli.main(["call", method, "--json", str(path), *extra])
    return code, capsys.readouterr().err


def assert_clean_exit(code: int, err: str) -> None:
    assert code in (0, 1, 2), code
    assert "Traceback" not in err
    if code != 0:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("planner call: "), err
        assert len(lines[0]) > len("planner call: ") + 5


def _paths(value: object, prefix: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            found += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _paths(v, (*prefix, i))
    return found


def _replaced(doc: object, path: tuple[object, ...], marker: str) -> object:
    doc = json.loads(json.dumps(doc))
    target = doc
    for key in path[:-1]:
        target = target[key]  # type: ignore[index]
    target[path[-1]] = marker  # type: ignore[index]
    return doc


@st.composite
def mutated_json(draw: st.DrawFn) -> tuple[str, str]:
    """(method, a valid request of it with one value replaced, or a field added)."""
    method = draw(st.sampled_from(sorted(VALID)))
    doc = VALID[method]
    marker = "\u2603MARK\u2603"
    if draw(st.booleans()):
        path = draw(st.sampled_from(_paths(doc)))
    else:
        path = (draw(st.sampled_from(["not_a_field", "snapshot", "requests", "id", "@type"])),)
    text = json.dumps(_replaced(doc, path, marker))
    if draw(st.booleans()):
        value = draw(st.sampled_from(RAW_NUMBERS))
    else:
        value = json.dumps(draw(JSON_VALUES))
    return method, text.replace(json.dumps(marker), value)


FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(text=st.one_of(st.text(max_size=40), st.just("[" * 5000), st.just('{"a":' * 3000)))
def test_text_that_is_not_a_request(tmp_path, capsys, text):
    code, err = run_call(tmp_path, capsys, ROTATION, text)
    assert_clean_exit(code, err)


@FUZZ
@given(value=JSON_VALUES)
def test_json_of_the_wrong_shape(tmp_path, capsys, value):
    code, err = run_call(tmp_path, capsys, ROTATION, json.dumps(value))
    assert_clean_exit(code, err)


@FUZZ
@given(case=mutated_json())
def test_one_value_replaced(tmp_path, capsys, case):
    method, text = case
    code, err = run_call(tmp_path, capsys, method, text)
    assert_clean_exit(code, err)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('{"snapshot": {"now_s": "soon"}}', "JSON: snapshot.now_s: "),
        (
            '{"snapshot": {"free_gpu_blocks": "99999999999999999999999"}}',
            "JSON: snapshot.free_gpu_blocks: ",
        ),
        ('{"snapshot": {"now_s": NaN}}', "JSON: snapshot.now_s: "),
        ('{"no_such_field": 1}', "JSON: no_such_field: "),
        ('{"snapshot": {"requests": [{"id": "a", "colour": 1}]}}', "snapshot.requests[0].colour: "),
        ('{"snapshot": {"requests": [{"id": ["a"]}]}}', "JSON: snapshot.requests.id: "),
        ('{"snapshot": {"requests": {"id": "a"}}}', "snapshot.requests: must be a JSON array"),
        ("{", "request is not a valid PlanRotation JSON"),
        ("", "request is not a valid PlanRotation JSON"),
    ],
)
def test_bad_json_names_the_field(tmp_path, capsys, text, named):
    code, err = run_call(tmp_path, capsys, ROTATION, text)
    assert code == 2
    assert_clean_exit(code, err)
    assert named in err


@pytest.mark.parametrize("deadline", ["nan", "-1", "0", "inf", "-inf"])
def test_bad_deadline_is_a_clean_error(tmp_path, capsys, deadline):
    code, err = run_call(
        tmp_path, capsys, ROTATION, json.dumps(ROTATION_JSON), f"--deadline-ms={deadline}"
    )
    assert code == 2, err
    assert_clean_exit(code, err)
    assert "--deadline-ms" in err


def test_binary_garbage_file(tmp_path, capsys):
    path = tmp_path / "garbage.json"
    path.write_bytes(bytes(range(256)) * 4)
    code = cli.main(["call", ROTATION, "--json", str(path)])
    err = capsys.readouterr().err
    assert code == 2
    assert_clean_exit(code, err)


def test_smoke_subprocess_bad_json_on_stdin():
    done = subprocess.run(
        [sys.executable, "-m", "planner.cli", "call", ROTATION],
        input='{"snapshot": {"now_s": "soon"}}',
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "now_s" in done.stderr


def test_top_level_repeated_field_not_a_list(tmp_path, capsys):
    code, err = run_call(tmp_path, capsys, "PlacementService.PartitionBatch", '{"requests": 5}')
    assert code == 2
    assert "JSON: requests: must be a JSON array, got 5" in err
