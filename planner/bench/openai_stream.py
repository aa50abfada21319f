"""Streamed /v1/completions requests to an OpenAI-compatible server (vLLM's),
each sent at its time, and when every output token reached the client.

Standard library only (asyncio streams, HTTP/1.1 with chunked transfer
encoding), so `planner profile` runs from the project's own environment
against any engine. Each request asks for continuous usage statistics: every
streamed chunk then says how many completion tokens the request has so far,
and a chunk carrying k new tokens (the server merged them) gives k token
times, all the chunk's arrival time. Greedy sampling, ignore_eos, so a request
produces exactly max_tokens tokens.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# Longest wait for the next byte of a response.
READ_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class StreamRequest:
    id: str
    # Seconds after the run starts.
    send_at_s: float
    prompt: str
    max_tokens: int


@dataclass(slots=True)
class StreamRecord:
    """What the client saw of one request; times in seconds from the run's
    start (time.perf_counter based)."""

    id: str
    send_at_s: float
    max_tokens: int
    # When the request was actually written (late when the client is busy).
    sent_s: float = float("nan")
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    # One entry per output token.
    token_times_s: list[float] = field(default_factory=list)
    # Chunks that carried more than one new token.
    merged_chunks: int = 0
    finish_reason: str | None = None
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.error is None and self.finish_reason is not None

    @property
    def finish_s(self) -> float | None:
        return self.token_times_s[-1] if self.done and self.token_times_s else None


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int
    path_prefix: str

    @staticmethod
    def parse(url: str) -> Endpoint:
        """http://HOST:PORT[/prefix]; ValueError naming what is wrong."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"expected http://HOST:PORT, got {url!r}")
        return Endpoint(parts.hostname, parts.port or 80, parts.path.rstrip("/"))


def completion_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }


class _ChunkedBody:
    """Decodes an HTTP/1.1 body (chunked, or read to EOF) into lines, each
    with the time its last byte arrived."""

    def __init__(self, reader: asyncio.StreamReader, chunked: bool) -> None:
        self._reader = reader
        self._chunked = chunked
        self._pending = b""
        self._eof = False

    async def _read_piece(self) -> bytes:
        r = self._reader
        if not self._chunked:
            return await asyncio.wait_for(r.read(65536), READ_TIMEOUT_S)
        size_line = await asyncio.wait_for(r.readline(), READ_TIMEOUT_S)
        if not size_line:
            return b""
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            await asyncio.wait_for(r.readline(), READ_TIMEOUT_S)
            return b""
        data = await asyncio.wait_for(r.readexactly(size + 2), READ_TIMEOUT_S)
        return data[:-2]

    async def lines(self) -> list[tuple[bytes, float]] | None:
        """The complete lines that the next piece of body finishes, with its
        arrival time; None at the end of the body."""
        while not self._eof:
            piece = await self._read_piece()
            now = time.perf_counter()
            if not piece:
                self._eof = True
                break
            self._pending += piece
            if b"\n" in self._pending:
                *done, self._pending = self._pending.split(b"\n")
                return [(line.rstrip(b"\r"), now) for line in done]
        if self._pending:
            rest, self._pending = self._pending, b""
            return [(rest, time.perf_counter())]
        return None


async def stream_one(
    endpoint: Endpoint, model: str, request: StreamRequest, start_s: float
) -> StreamRecord:
    """Sends request at start_s + its send_at_s (perf_counter) and reads its
    stream to the end."""
    await asyncio.sleep(max(0.0, start_s + request.send_at_s - time.perf_counter()))
    record = StreamRecord(request.id, request.send_at_s, request.max_tokens)
    body = json.dumps(completion_body(model, request.prompt, request.max_tokens)).encode()
    head = (
        f"POST {endpoint.path_prefix}/v1/completions HTTP/1.1\r\n"
        f"Host: {endpoint.host}:{endpoint.port}\r\n"
        "Content-Type: application/json\r\n"
        "Accept: text/event-stream\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    writer: asyncio.StreamWriter | None = None
    try:
        reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
        record.sent_s = time.perf_counter() - start_s
        writer.write(head + body)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), READ_TIMEOUT_S)
        parts = status_line.decode("latin-1").split(" ", 2)
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        headers: dict[str, str] = {}
        while True:
            line = await asyncio.wait_for(reader.readline(), READ_TIMEOUT_S)
            if line in (b"\r\n", b"\n", b""):
                break
            key, _, value = line.decode("latin-1").partition(":")
            headers[key.strip().lower()] = value.strip()
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        stream = _ChunkedBody(reader, chunked)
        if status != 200:
            text = b""
            while (lines := await stream.lines()) is not None:
                text += b"\n".join(line for line, _ in lines)
            record.error = f"HTTP {status}: {text.decode(errors='replace')[:200]}"
            return record
        while (lines := await stream.lines()) is not None:
            for line, arrived in lines:
                if _take_event(record, line, arrived - start_s):
                    return record
        if record.finish_reason is None and record.error is None:
            record.error = "the stream ended without a finish reason"
    except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    finally:
        if writer is not None:
            writer.close()
    return record


def _take_event(record: StreamRecord, line: bytes, at_s: float) -> bool:
    """One server-sent event line; True at the stream's [DONE]."""
    if not line.startswith(b"data:"):
        return False
    data = line[len(b"data:") :].strip()
    if data == b"[DONE]":
        return True
    chunk = json.loads(data)
    usage = chunk.get("usage") or {}
    if "prompt_tokens" in usage:
        record.prompt_tokens = int(usage["prompt_tokens"])
    choices = chunk.get("choices") or ()
    if choices and "completion_tokens" in usage:
        total = int(usage["completion_tokens"])
        new = total - len(record.token_times_s)
        if new > 1:
            record.merged_chunks += 1
        record.token_times_s.extend([at_s] * max(new, 0))
    elif choices and any(c.get("text") for c in choices):
        # A server without continuous usage statistics: one token a chunk.
        record.token_times_s.append(at_s)
    for choice in choices:
        if choice.get("finish_reason"):
            record.finish_reason = str(choice["finish_reason"])
    if "completion_tokens" in usage:
        record.completion_tokens = int(usage["completion_tokens"])
    return False


async def _run(endpoint: Endpoint, model: str, requests: Sequence[StreamRequest]) -> list[Any]:
    start_s = time.perf_counter()
    return list(await asyncio.gather(*(stream_one(endpoint, model, r, start_s) for r in requests)))


def run_requests(url: str, model: str, requests: Sequence[StreamRequest]) -> list[StreamRecord]:
    """Sends every request at its time (from now) and waits for all; the
    records in the order of requests."""
    records: list[StreamRecord] = asyncio.run(_run(Endpoint.parse(url), model, requests))
    return records
