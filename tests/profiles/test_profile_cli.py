"""`planner profile`'s bad input: one line naming the flag, exit 2, nothing
written; an engine that answers no request: exit 1, nothing written."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from planner.cli import main

CONFIG = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "vocab_size": 2048,
    "dtype": "float32",
}


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIG), encoding="utf-8")
    return folder


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A port bound and never listened on: every connection is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def argv(url: str, model_dir: Path, out: Path, **overrides: str) -> list[str]:
    flags = {
        "--url": url,
        "--model-dir": str(model_dir),
        "--block-size": "32",
        "--gpu-kv-blocks": "128",
        "--max-batched-tokens": "2048",
        "--max-running": "128",
        "--max-model-len": "1024",
        "--repeats": "1",
        "--out": str(out),
        **overrides,
    }
    return ["profile", "--quick", "--quiet", *(x for kv in flags.items() for x in kv)]


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--url", "ftp://host:1", "--url: expected http://HOST:PORT"),
        ("--block-size", "0", "--block-size must be >= 1, got 0"),
        ("--gpu-kv-blocks", "-3", "--gpu-kv-blocks must be >= 1, got -3"),
        ("--repeats", "0", "--repeats must be >= 1, got 0"),
    ],
)
def test_a_bad_flag_is_named_and_nothing_is_written(
    capsys, model_dir, refused_url, tmp_path, flag, value, message
):
    out = tmp_path / "profile.json"
    code = main(argv(refused_url, model_dir, out, **{flag: value}))
    _, err = capsys.readouterr()
    assert code == 2
    assert err.startswith(f"planner profile: {message}")
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_a_model_folder_without_a_usable_config_is_named(capsys, tmp_path, refused_url):
    out = tmp_path / "profile.json"
    assert main(argv(refused_url, tmp_path / "missing", out)) == 2
    assert "--model-dir: cannot read" in capsys.readouterr().err
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({**CONFIG, "hidden_size": 0}))
    assert main(argv(refused_url, broken, out)) == 2
    assert "--model-dir: config.json: hidden_size must be a positive integer" in (
        capsys.readouterr().err
    )
    assert not out.exists()


def test_an_out_path_that_is_a_folder_is_named(capsys, model_dir, refused_url, tmp_path):
    assert main(argv(refused_url, model_dir, tmp_path)) == 2
    assert f"--out {tmp_path}: is a folder" in capsys.readouterr().err


def test_an_engine_that_answers_nothing_fails_with_its_error(
    capsys, model_dir, refused_url, tmp_path
):
    out = tmp_path / "profile.json"
    code = main(argv(refused_url, model_dir, out))
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("planner profile: every probe request failed, e.g. ")
    assert "refused" in err.lower() or "errno" in err.lower()
    assert not out.exists()
