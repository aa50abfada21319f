"""A call a client holds open on a server: a reflection stream that takes
one of the server's call slots, and one of its workers, until released."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc


@contextmanager
def held_call(address: str) -> Iterator[tuple[grpc.Channel, threading.Event]]:
    """The held call's channel (open for other calls too) and the event that
    ends the call; it ends at the latest when the block does, and the
    server then closes the stream without another answer."""
    release = threading.Event()

    def reflection_requests() -> Iterator[reflection_pb2.ServerReflectionRequest]:
        yield reflection_pb2.ServerReflectionRequest(list_services="")
        release.wait(timeout=30)

    with grpc.insecure_channel(address) as ch:
        stream = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo(
            reflection_requests(), timeout=30
        )
        assert next(stream).HasField("list_services_response")
        try:
            yield ch, release
        finally:
            release.set()
        assert list(stream) == []
