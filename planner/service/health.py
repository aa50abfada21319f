"""The standard health service, `grpc.health.v1.Health` (Check and Watch),
safe with any number of Watch streams opening and closing at once.

gRPC Python runs every stream-closed callback on its one serving thread, and
a message send waits for that thread to report the write. So nothing here
holds a lock while it sends: a send that waited on the serving thread while
the serving thread waited on the same lock would stop both for good (and
with them every RPC and the graceful shutdown). The locks below are held
only around dictionary updates.

Watch streams are non-blocking (no handler thread waits on one), at most
`max_watchers` at once (more are refused with RESOURCE_EXHAUSTED), and end
when the server shuts down, after their last NOT_SERVING.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
OVERALL = ""
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
# Far more than the load balancers and orchestrators that watch one server;
# each stream holds a few hundred bytes and no thread.
DEFAULT_MAX_WATCHERS = 1024

Status = int
SendResponse = Callable[[health_pb2.HealthCheckResponse | None], None]


class _Watcher:
    """One Watch stream. A post asks for the current status to be sent; one
    send runs at a time, by whichever thread posted while none was under
    way, and it reads the status when it sends, so a stream never ends on a
    stale status (a watcher wants the current status, not every step)."""

    def __init__(self, send: SendResponse, current: Callable[[], Status]) -> None:
        self._send = send
        self._current = current
        self._lock = threading.Lock()
        self._dirty = False
        self._finish = False
        self._sending = False
        self._closed = False
        self._last_sent: Status | None = None

    def post(self, *, finish: bool = False) -> None:
        """Send the current status (and then, with finish, end the stream)
        unless another thread is sending already: that one sends it."""
        with self._lock:
            if self._closed:
                return
            self._dirty = True
            self._finish = self._finish or finish
            if self._sending:
                return
            self._sending = True
        try:
            self._drain()
        except BaseException:
            with self._lock:
                self._closed = True
                self._sending = False
            raise

    def _drain(self) -> None:
        while True:
            with self._lock:
                dirty, self._dirty = self._dirty, False
                if self._closed or not (dirty or self._finish):
                    self._sending = False
                    return
                finish = not dirty
                if finish:
                    self._closed = True
                    self._sending = False
            if finish:
                self._send(None)
                return
            status = self._current()
            if status != self._last_sent:
                self._last_sent = status
                self._send(health_pb2.HealthCheckResponse(status=status))

    def close(self) -> None:
        """The stream ended (client gone, deadline, cancel): send nothing more.
        Runs on gRPC's serving thread, so it only takes this watcher's lock,
        which no send holds."""
        with self._lock:
            self._closed = True


class HealthService:
    """Serving status per service name ("" for the server as a whole)."""

    def __init__(self, max_watchers: int = DEFAULT_MAX_WATCHERS) -> None:
        if max_watchers <= 0:
            raise ValueError("max_watchers must be > 0")
        self._max_watchers = max_watchers
        self._lock = threading.Lock()
        self._status: dict[str, Status] = {OVERALL: SERVING}
        self._watchers: dict[str, set[_Watcher]] = {}
        self._watching = 0
        self._shutting_down = False

    # ---- status ------------------------------------------------------------

    def set(self, service: str, status: Status) -> None:
        """Sets service's status and tells its watchers (ignored once the
        graceful shutdown began). Call it from any thread but gRPC's own."""
        with self._lock:
            if self._shutting_down or self._status.get(service) == status:
                return
            self._status[service] = status
            watchers = list(self._watchers.get(service, ()))
        for watcher in watchers:
            watcher.post()

    def status(self, service: str) -> Status | None:
        with self._lock:
            return self._status.get(service)

    def _watched_status(self, service: str) -> Status:
        with self._lock:
            return self._status.get(service, int(SERVICE_UNKNOWN))

    def watchers(self) -> int:
        with self._lock:
            return self._watching

    def enter_graceful_shutdown(self) -> None:
        """Every service NOT_SERVING for good; each watcher gets it and its
        stream ends."""
        with self._lock:
            if self._shutting_down:
                return
            self._shutting_down = True
            for service in self._status:
                self._status[service] = NOT_SERVING
            watchers = [w for ws in self._watchers.values() for w in ws]
        for watcher in watchers:
            watcher.post(finish=True)

    # ---- RPCs --------------------------------------------------------------

    def check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        status = self.status(request.service)
        if status is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    def watch(
        self,
        request: health_pb2.HealthCheckRequest,
        context: grpc.ServicerContext,
        send_response_callback: SendResponse | None = None,
    ) -> None:
        if send_response_callback is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Watch needs a non-blocking server")
        assert send_response_callback is not None
        service = request.service
        watcher = _Watcher(send_response_callback, lambda: self._watched_status(service))
        with self._lock:
            full = self._watching >= self._max_watchers
            if not full:
                self._watchers.setdefault(service, set()).add(watcher)
                self._watching += 1
            finish = self._shutting_down
        if full:
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self._max_watchers} health Watch streams are open; use Check",
            )
        if not context.add_callback(lambda: self._forget(service, watcher)):
            self._forget(service, watcher)  # the stream ended already
            return
        watcher.post(finish=finish)

    def _forget(self, service: str, watcher: _Watcher) -> None:
        with self._lock:
            watchers = self._watchers.get(service)
            if watchers is not None and watcher in watchers:
                watchers.remove(watcher)
                self._watching -= 1
                if not watchers:
                    del self._watchers[service]
        watcher.close()

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        watch: Any = self.watch
        # gRPC Python then passes send_response_callback and holds no thread
        # for the stream's life.
        watch_handler: Any = grpc.unary_stream_rpc_method_handler(
            _NonBlocking(watch),
            request_deserializer=health_pb2.HealthCheckRequest.FromString,
            response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
        )
        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "Check": grpc.unary_unary_rpc_method_handler(
                    self.check,
                    request_deserializer=health_pb2.HealthCheckRequest.FromString,
                    response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
                ),
                "Watch": watch_handler,
            },
        )


class _NonBlocking:
    """A stream handler gRPC Python calls with send_response_callback (its
    experimental_non_blocking protocol)."""

    experimental_non_blocking = True

    def __init__(self, behavior: Callable[..., None]) -> None:
        self._behavior = behavior

    def __call__(
        self, request: Any, context: grpc.ServicerContext, send_response_callback: SendResponse
    ) -> None:
        self._behavior(request, context, send_response_callback)
