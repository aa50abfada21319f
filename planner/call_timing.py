"""Where one planner call's time goes, per call: the server's three moments
(its polling thread took the call up, a worker thread started the handler,
the handler returned), sent back in the call's trailing metadata when the
client asks for them with the metadata key TIMING_KEY, and the client's own
moments around them.

Every moment is `time.perf_counter_ns()`, which on Linux reads
CLOCK_MONOTONIC: one clock for every process of the machine, so a client
and a server on the same host (loopback) can subtract each other's moments.
Across hosts the server's three are comparable only with each other."""

from __future__ import annotations

from dataclasses import dataclass

# Request metadata key that asks for the server's moments, and the trailing
# metadata key that carries them ("seen,start,end", nanoseconds).
TIMING_KEY = "planner-timing"


@dataclass(frozen=True, slots=True)
class ServerTiming:
    # The server's polling thread took the call up (looked its method up).
    seen_ns: int
    # A worker thread started the handler. In between, gRPC's sync server
    # hands the call to a worker thread, which asks for the request message
    # and waits until the polling thread has received it (grpc/_server.py,
    # _unary_request): two more thread wake-ups.
    start_ns: int
    # The handler returned (the response is serialized and sent after).
    end_ns: int

    def header(self) -> str:
        return f"{self.seen_ns},{self.start_ns},{self.end_ns}"

    @staticmethod
    def parse(value: str | bytes) -> ServerTiming | None:
        """The moments of a TIMING_KEY trailer; None when it is not one."""
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        parts = text.split(",")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            return None
        seen, start, end = (int(p) for p in parts)
        return ServerTiming(seen, start, end)


@dataclass(frozen=True, slots=True)
class CallTiming:
    """One call's moments, client and server, on one host. handed_ns: the
    engine's thread handed the call over (pipelined) or started it;
    picked_ns: the thread that makes the gRPC call started it; returned_ns:
    that thread had the answer (or the error). server: None when the server
    sent no moments (an error before its handler, an older server)."""

    handed_ns: int
    picked_ns: int
    returned_ns: int
    server: ServerTiming | None
    code: str

    def parts_ms(self) -> dict[str, float]:
        """The call cut at each moment, milliseconds: hand-over (to the
        sending thread), inbound (serialization, transport and the server's
        polling thread waking), server queue (the hand-over to a worker
        thread and the request message's delivery to it), handler, outbound
        (serialization, transport, the caller's thread waking and parsing);
        total = their sum."""
        out = {
            "total": (self.returned_ns - self.handed_ns) / 1e6,
            "hand_over": (self.picked_ns - self.handed_ns) / 1e6,
        }
        s = self.server
        if s is not None:
            out["inbound"] = (s.seen_ns - self.picked_ns) / 1e6
            out["server_queue"] = (s.start_ns - s.seen_ns) / 1e6
            out["handler"] = (s.end_ns - s.start_ns) / 1e6
            out["outbound"] = (self.returned_ns - s.end_ns) / 1e6
        return out

    def to_json(self) -> dict[str, object]:
        s = self.server
        return {
            "handed_ns": self.handed_ns,
            "picked_ns": self.picked_ns,
            "returned_ns": self.returned_ns,
            "seen_ns": None if s is None else s.seen_ns,
            "start_ns": None if s is None else s.start_ns,
            "end_ns": None if s is None else s.end_ns,
            "code": self.code,
        }

    @staticmethod
    def from_json(raw: dict[str, object]) -> CallTiming:
        def ns(key: str) -> int:
            value = raw[key]
            assert isinstance(value, int)
            return value

        server = (
            ServerTiming(ns("seen_ns"), ns("start_ns"), ns("end_ns"))
            if raw.get("seen_ns") is not None
            else None
        )
        return CallTiming(
            ns("handed_ns"), ns("picked_ns"), ns("returned_ns"), server, str(raw["code"])
        )
