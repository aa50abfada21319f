"""The streaming client's HTTP/1.1 and server-sent-event handling: chunked
bodies split anywhere, merged tokens, errors. The server here is a plain
socket server that writes the bytes given to it (vLLM's own streaming is
exercised by the end-to-end tier, tests/e2e)."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest

from planner.bench.openai_stream import (
    Endpoint,
    StreamRecord,
    StreamRequest,
    _take_event,
    run_requests,
)


def _event(text: str, completion_tokens: int, finish: str | None = None) -> bytes:
    chunk = {
        "choices": [{"index": 0, "text": text, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": 7,
            "completion_tokens": completion_tokens,
            "total_tokens": 7 + completion_tokens,
        },
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _chunked(body: bytes, piece: int) -> bytes:
    out = b""
    for i in range(0, len(body), piece):
        part = body[i : i + piece]
        out += f"{len(part):x}\r\n".encode() + part + b"\r\n"
    return out + b"0\r\n\r\n"


class ByteServer:
    """Answers every connection with the given bytes, after reading the
    request, then closes."""

    def __init__(self, response: bytes) -> None:
        self.response = response
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.bodies: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                while len(body) < length:
                    body += conn.recv(65536)
                self.bodies.append(body)
                conn.sendall(self.response)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def serve() -> Iterator[type[ByteServer]]:
    servers: list[ByteServer] = []

    def make(response: bytes) -> ByteServer:
        server = ByteServer(response)
        servers.append(server)
        return server

    yield make  # type: ignore[misc]
    for s in servers:
        s.close()


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize("piece", [1, 7, 64, 100_000])
def test_a_chunked_stream_split_anywhere_gives_every_token(serve, piece):
    body = (
        _event("a", 1)
        + _event("b", 2)
        + _event("cde", 5)  # three tokens merged into one chunk
        + _event("f", 6, "length")
        + b'data: {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 6}}\n\n'
        + b"data: [DONE]\n\n"
    )
    server = serve(HEAD + _chunked(body, piece))
    [record] = run_requests(
        f"http://127.0.0.1:{server.port}", "m", [StreamRequest("r", 0.0, "hi", 6)]
    )
    assert record.error is None
    assert record.done and record.finish_reason == "length"
    assert record.prompt_tokens == 7 and record.completion_tokens == 6
    assert len(record.token_times_s) == 6
    assert record.merged_chunks == 1
    # The merged tokens arrived together.
    assert record.token_times_s[2] == record.token_times_s[3] == record.token_times_s[4]
    assert record.sent_s <= record.token_times_s[0] <= record.token_times_s[-1]
    sent = json.loads(server.bodies[0])
    assert sent["stream"] and sent["ignore_eos"] and sent["max_tokens"] == 6
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def test_an_http_error_is_recorded_not_raised(serve):
    message = b'{"error": "max_tokens is too large"}'
    server = serve(
        b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n" % len(message) + message
    )
    [record] = run_requests(
        f"http://127.0.0.1:{server.port}", "m", [StreamRequest("r", 0.0, "hi", 6)]
    )
    assert not record.done
    assert record.error is not None and "HTTP 400" in record.error
    assert "max_tokens is too large" in record.error


def test_a_stream_cut_short_is_an_error(serve):
    server = serve(HEAD + _chunked(_event("a", 1), 1000)[:-5])
    [record] = run_requests(
        f"http://127.0.0.1:{server.port}", "m", [StreamRequest("r", 0.0, "hi", 6)]
    )
    assert not record.done and record.error is not None
    assert record.token_times_s  # what came before the cut is kept


def test_nobody_listening_is_an_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    [record] = run_requests(f"http://127.0.0.1:{port}", "m", [StreamRequest("r", 0.0, "x", 1)])
    assert not record.done and "Error" in (record.error or "")


def test_a_server_without_usage_statistics_counts_a_token_per_chunk():
    record = StreamRecord("r", 0.0, 3)
    for i, text in enumerate(("a", "", "b")):
        _take_event(record, b"data: " + json.dumps({"choices": [{"text": text}]}).encode(), i)
    assert record.token_times_s == [0.0, 2.0]


def test_endpoint_parsing():
    assert Endpoint.parse("http://localhost:8000") == Endpoint("localhost", 8000, "")
    assert Endpoint.parse("http://h:1/x/") == Endpoint("h", 1, "/x")
    with pytest.raises(ValueError, match="http://HOST:PORT"):
        Endpoint.parse("https://h:1")
    with pytest.raises(ValueError):
        Endpoint.parse("localhost:8000")
