"""A bursty load through an OpenAI-compatible HTTP API (vLLM's
/v1/completions, streamed), and what each request saw: time to first token,
the gaps between tokens, the text. Greedy sampling, a fixed number of output
tokens per request (ignore_eos), so runs are comparable token for token.
Needs aiohttp (the engine environment has it through vLLM)."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

from planner.bench.tiny_llama import prompt_text


@dataclass(frozen=True, slots=True)
class LoadRequest:
    id: str
    # Seconds after the load starts.
    send_at_s: float
    prompt: str
    max_tokens: int


@dataclass(frozen=True, slots=True)
class BurstyLoad:
    """num_bursts bursts of burst_size requests, burst_gap_s apart; prompt
    words and output tokens drawn uniformly from the ranges (seeded)."""

    num_bursts: int = 4
    burst_size: int = 50
    burst_gap_s: float = 5.0
    # Requests of one burst arrive over this many seconds.
    burst_spread_s: float = 0.5
    prompt_words: tuple[int, int] = (40, 200)
    output_tokens: tuple[int, int] = (16, 96)
    seed: int = 0

    def requests(self) -> list[LoadRequest]:
        rng = random.Random(self.seed)
        out: list[LoadRequest] = []
        for b in range(self.num_bursts):
            for i in range(self.burst_size):
                n = len(out)
                out.append(
                    LoadRequest(
                        id=f"b{b}-{i}",
                        send_at_s=b * self.burst_gap_s + rng.uniform(0, self.burst_spread_s),
                        prompt=prompt_text(rng.randint(*self.prompt_words), self.seed * 7919 + n),
                        max_tokens=rng.randint(*self.output_tokens),
                    )
                )
        return sorted(out, key=lambda r: (r.send_at_s, r.id))


@dataclass(frozen=True, slots=True)
class LongDecodesLoad:
    """Lasting KV pressure: num_long requests with long prompts and long
    outputs arrive first and hold most of the KV while they decode; then
    num_short short requests arrive one every short_gap_s from short_start_s
    and queue behind them (prompt words and output tokens drawn uniformly,
    seeded)."""

    num_long: int = 4
    long_prompt_words: tuple[int, int] = (280, 320)
    long_output_tokens: tuple[int, int] = (440, 520)
    num_short: int = 60
    short_start_s: float = 1.0
    short_gap_s: float = 0.2
    short_prompt_words: tuple[int, int] = (30, 60)
    short_output_tokens: tuple[int, int] = (16, 32)
    seed: int = 0

    def requests(self) -> list[LoadRequest]:
        rng = random.Random(self.seed)
        out: list[LoadRequest] = []
        for i in range(self.num_long):
            out.append(
                LoadRequest(
                    id=f"long-{i}",
                    send_at_s=0.05 * i,
                    prompt=prompt_text(rng.randint(*self.long_prompt_words), self.seed * 7919 + i),
                    max_tokens=rng.randint(*self.long_output_tokens),
                )
            )
        for i in range(self.num_short):
            n = len(out)
            out.append(
                LoadRequest(
                    id=f"short-{i}",
                    send_at_s=self.short_start_s + i * self.short_gap_s,
                    prompt=prompt_text(rng.randint(*self.short_prompt_words), self.seed * 7919 + n),
                    max_tokens=rng.randint(*self.short_output_tokens),
                )
            )
        return sorted(out, key=lambda r: (r.send_at_s, r.id))


@dataclass(slots=True)
class RequestRecord:
    id: str
    sent_s: float
    max_tokens: int
    # Arrival time of every streamed chunk that carried text, perf_counter.
    token_times_s: list[float] = field(default_factory=list)
    text: str = ""
    completion_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.error is None and self.finish_reason is not None

    @property
    def ttft_s(self) -> float | None:
        return self.token_times_s[0] - self.sent_s if self.token_times_s else None

    @property
    def tbt_s(self) -> list[float]:
        t = self.token_times_s
        return [b - a for a, b in itertools.pairwise(t)]

    @property
    def tpot_s(self) -> float | None:
        t = self.token_times_s
        if len(t) < 2:
            return None
        return (t[-1] - t[0]) / (len(t) - 1)


async def _one(
    session: Any, url: str, model: str, request: LoadRequest, start_s: float
) -> RequestRecord:
    await asyncio.sleep(max(0.0, start_s + request.send_at_s - time.perf_counter()))
    record = RequestRecord(request.id, time.perf_counter(), request.max_tokens)
    body = {
        "model": model,
        "prompt": request.prompt,
        "max_tokens": request.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    try:
        # vLLM names the request after this header (engine logs then match).
        headers = {"X-Request-Id": request.id}
        async with session.post(f"{url}/v1/completions", json=body, headers=headers) as response:
            if response.status != 200:
                record.error = f"HTTP {response.status}: {(await response.text())[:200]}"
                return record
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                now = time.perf_counter()
                for choice in chunk.get("choices") or ():
                    if choice.get("text"):
                        record.token_times_s.append(now)
                        record.text += choice["text"]
                    if choice.get("finish_reason"):
                        record.finish_reason = choice["finish_reason"]
                usage = chunk.get("usage")
                if usage:
                    record.completion_tokens = int(usage["completion_tokens"])
    except Exception as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    return record


async def run_load_async(url: str, model: str, requests: list[LoadRequest]) -> list[RequestRecord]:
    import aiohttp  # noqa: PLC0415 - aiohttp is in the engines environment only

    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    # A connection per request: a pooled one that the server's keep-alive
    # timeout (uvicorn: 5 s, the gap between bursts) closes as it is reused
    # would fail that request.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        start_s = time.perf_counter()
        return list(
            await asyncio.gather(*(_one(session, url, model, r, start_s) for r in requests))
        )


def run_load(url: str, model: str, requests: list[LoadRequest]) -> list[RequestRecord]:
    """Sends every request at its time and waits for all of them."""
    return asyncio.run(run_load_async(url, model, requests))
