"""Where the durable store lives, as `--store` names it: a SQLite file (the
embedded default), ":memory:" (nothing kept), or a PostgreSQL URL
(postgresql://user@host:port/database), which several planner replicas
can share. Messages and logs name a URL without its password."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

POSTGRESQL_SCHEMES = ("postgresql", "postgres")
HIDDEN = "***"


def is_postgresql_url(location: str) -> bool:
    scheme, sep, _ = location.partition("://")
    return bool(sep) and scheme.lower() in POSTGRESQL_SCHEMES


def without_password(url: str) -> str:
    """url with its password (in the user part or a `password` parameter)
    replaced by ***; a URL that cannot be parsed is shown as its scheme."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return f"{url.partition('://')[0]}://{HIDDEN}"
    netloc = parts.hostname or ""
    if parts.hostname and ":" in parts.hostname:
        netloc = f"[{parts.hostname}]"
    if port is not None:
        netloc = f"{netloc}:{port}"
    if parts.username is not None:
        user = parts.username + (f":{HIDDEN}" if parts.password is not None else "")
        netloc = f"{user}@{netloc}"
    query = urlencode(
        [
            (k, HIDDEN if k.lower() == "password" else v)
            for k, v in parse_qsl(parts.query, keep_blank_values=True)
        ],
        safe="*/:,",
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def password_of(url: str) -> str | None:
    """The password the URL carries, if any (to scrub it from messages)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    if parts.password:
        return parts.password
    for k, v in parse_qsl(parts.query):
        if k.lower() == "password" and v:
            return v
    return None
