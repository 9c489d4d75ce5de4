"""What a stream's opening and answer carry besides the request's own headers (docs/tunnel.md).

HTTP/2 forbids the connection-specific headers (``connection``, ``upgrade``, ``keep-alive`` ...) and
has no 101, so an Upgrade travels as ``sxwl-upgrade`` on the opening and ``sxwl-upgraded`` on the
answer, and the agent speaks HTTP/1.1 with the real headers to the target."""

from __future__ import annotations

import re

Headers = list[tuple[str, str]]

TARGET = "sxwl-target"  # host:port of the CPod-side service; the agent decides whether it may
UPGRADE = "sxwl-upgrade"  # the request's Upgrade value: the stream becomes raw bytes after the answer
UPGRADED = "sxwl-upgraded"  # on a 200 answer: the target switched protocols (it answered 101)
CPOD = "sxwl-cpod"  # on a relay between replicas: whose tunnel carries the stream
ERROR = "sxwl-tunnel-error"  # set by the agent on an answer of its own (target refused, unreachable)

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "upgrade",
        "te",
        "trailer",
        "host",
        "http2-settings",
    }
)
_TARGET_RE = re.compile(r"^(?P<host>[A-Za-z0-9.\-]{1,253}|\[[0-9A-Fa-f:]{2,39}\]):(?P<port>[0-9]{1,5})$")


def end_to_end(headers: Headers) -> Headers:
    """The headers that may cross the tunnel: lower-case names, no hop-by-hop ones (nor those the
    ``Connection`` header names), none of the tunnel's own and no pseudo-headers."""
    named: set[str] = set()
    for name, value in headers:
        if name.lower() == "connection":
            named.update(part.strip().lower() for part in value.split(","))
    return [
        (name.lower(), value)
        for name, value in headers
        if name.lower() not in HOP_BY_HOP
        and name.lower() not in named
        and not name.startswith(":")
        and not name.lower().startswith("sxwl-")
    ]


def upgrade_of(headers: Headers) -> str | None:
    """The protocol an HTTP/1.1 request asks to switch to, if it asks."""
    connection = ",".join(v for n, v in headers if n.lower() == "connection").lower()
    wanted = [v for n, v in headers if n.lower() == "upgrade"]
    if wanted and "upgrade" in (part.strip() for part in connection.split(",")):
        return wanted[0]
    return None


def split_target(target: str) -> tuple[str, int] | None:
    """``host:port`` as a pair, or None when it is not one."""
    match = _TARGET_RE.match(target)
    if match is None or not 0 < int(match["port"]) < 65536:
        return None
    return match["host"].strip("[]"), int(match["port"])


def first(headers: Headers, name: str) -> str | None:
    return next((value for key, value in headers if key == name), None)
