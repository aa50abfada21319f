"""How many connections the server accepts, and the file descriptors they use.

Every TCP connection holds a file descriptor from the moment it is accepted,
before any byte, TLS handshake or token. With the soft RLIMIT_NOFILE often at
1,024, idle sockets that never send a byte would otherwise exhaust it: accept
fails and no client gets in until gRPC's handshake timeout (120 s by
default) drops them. So the server raises its soft limit to the hard limit
at start, accepts at most `max_connections` connections (fewer when the
descriptor limit leaves less room), drops a connection whose handshake has
not finished within `handshake_timeout_s`, and closes one that carried no
call for `connection_idle_s`.
"""

from __future__ import annotations

import resource

# Descriptors the server needs besides its connections: the store file and
# its WAL, listening sockets, the metrics endpoint and its scrapes, gRPC's
# event fds and pipes, logs.
RESERVED_FDS = 128
# Below this many connections a server is not worth starting.
MIN_CONNECTIONS = 16


class DescriptorLimitError(OSError):
    """The descriptor limit leaves too little room for connections."""


def raise_descriptor_limit() -> int:
    """Raises the soft RLIMIT_NOFILE to the hard limit (no privilege needed);
    returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if target == resource.RLIM_INFINITY:
        # Linux refuses an infinite RLIMIT_NOFILE; it caps at nr_open.
        target = _nr_open(default=max(soft, 1 << 20))
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft
    return target


def _nr_open(default: int) -> int:
    try:
        with open("/proc/sys/fs/nr_open", encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return default


def connection_cap(max_connections: int) -> int:
    """max_connections, lowered so that the connections and RESERVED_FDS fit
    in the current soft descriptor limit; DescriptorLimitError when fewer
    than MIN_CONNECTIONS would."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    room = soft - RESERVED_FDS
    if room < MIN_CONNECTIONS:
        raise DescriptorLimitError(
            f"the open-file limit ({soft}) leaves room for {max(room, 0)} connections; "
            f"raise it (ulimit -n) to at least {RESERVED_FDS + MIN_CONNECTIONS}"
        )
    return min(max_connections, room)
