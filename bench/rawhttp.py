"""A lean HTTP/1.1 keep-alive client for load generators.

httpx spends about a millisecond of CPU per request; on a 2-core machine where the load generator
shares the cores with the server under test, that is as much as the server's own work. This client
sends pre-encoded requests over asyncio streams and parses only the status line, the headers and a
Content-Length or chunked body (a long-poll held past its keep-alive is streamed), which is all the
cloud answers with.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit


class RawHttpError(Exception):
    pass


class RawConnection:
    """One connection; one request at a time (as one agent sends its heartbeats)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"plain http://host:port URLs only, not {url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self._host_header = f"{self.host}:{self.port}".encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> RawConnection:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._reader = self._writer = None

    def head(self, method: str, path: str, headers: dict[str, str]) -> bytes:
        """The request line and headers, without Content-Length: encode once, send many times."""
        lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: " + self._host_header]
        lines += [f"{name}: {value}".encode() for name, value in headers.items()]
        return b"\r\n".join(lines) + b"\r\n"

    async def request(self, head: bytes, body: bytes) -> tuple[int, bytes]:
        """Sends ``head`` (from :meth:`head`) with ``body``; the status and the response body."""
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        self._writer.write(b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body))
        try:
            header = await self._reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            await self.close()
            raise RawHttpError(f"connection closed: {exc!r}") from exc
        status_line, _, rest = header.partition(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        length, close_after, chunked = 0, False, False
        for line in rest.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
            elif name.lower() == b"connection":
                close_after = value.strip().lower() == b"close"
            elif name.lower() == b"transfer-encoding":
                chunked = value.strip().lower() == b"chunked"
        try:
            if chunked:
                payload = await self._read_chunks()
            else:
                payload = await self._reader.readexactly(length) if length else b""
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            await self.close()
            raise RawHttpError(f"connection closed: {exc!r}") from exc
        if close_after:
            await self.close()
        return status, payload

    async def _read_chunks(self) -> bytes:
        assert self._reader is not None
        parts: list[bytes] = []
        while size := int((await self._reader.readuntil(b"\r\n")).split(b";")[0], 16):
            parts.append(await self._reader.readexactly(size))
            await self._reader.readexactly(2)
        await self._reader.readuntil(b"\r\n")  # no trailers: the blank line that ends the body
        return b"".join(parts)
