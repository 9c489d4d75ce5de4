"""The tunnels this process holds, and the way to a CPod's tunnel held by another replica
(docs/tunnel.md). Nothing here knows HTTP frameworks: the WebSocket routes hand in transports.

Each process has a row in ``tunnel_replicas`` (where other replicas reach it), renewed every
``RENEW_S``, and one in ``tunnel_holders`` per CPod whose connections it holds. A process that stops
deletes its rows; one whose row was not renewed for ``STALE_S`` is skipped (killed outright), and its
rows are removed after ``FORGET_S``."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
import time
from datetime import timedelta

from h2.errors import ErrorCodes
from sqlalchemy import delete, select, update

from sxwl.cloud.db.engine import Database
from sxwl.cloud.db.tunnel_models import TunnelHolder, TunnelReplica
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.kit.security import SecretBox
from sxwl.cloud.tunnel import relay
from sxwl.tunnel.headers import CPOD, Headers
from sxwl.tunnel.session import PING_S, Session, StreamReset, Transport, TunnelStream

log = logging.getLogger("sxwl.cloud.tunnel")

RENEW_S = 30.0
STALE_S = 3 * RENEW_S
FORGET_S = 3600.0  # a process's rows outlive it this long at most (one killed outright deletes nothing)
RELAY_PURPOSE = b"tunnel-relay"
RELAY_SKEW_S = 60


class NoTunnel(Exception):
    """No replica holds a working tunnel of this CPod."""


class Tunnels:
    def __init__(self, db: Database, box: SecretBox, replica_url: str, ping_s: float = PING_S) -> None:
        self.db, self.box, self.ping_s = db, box, ping_s
        self.replica_url = replica_url.rstrip("/")
        self.replica = secrets.token_hex(8)
        self.held: dict[str, list[Session]] = {}
        self._relays: dict[str, Session] = {}
        self._relay_tasks: set[asyncio.Task[None]] = set()
        self._record_lock = asyncio.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None

    # An agent's connection, for as long as it lasts.
    async def hold(self, cpod_id: str, transport: Transport) -> None:
        session = Session(transport, client_side=True, ping_s=self.ping_s, ping_timeout_s=self.ping_s)
        self.held.setdefault(cpod_id, []).append(session)
        try:
            await self._record(cpod_id)
            await session.run()
        finally:
            held = self.held.get(cpod_id, [])
            if session in held:
                held.remove(session)
            if not held:
                self.held.pop(cpod_id, None)
            with contextlib.suppress(Exception):
                await self._record(cpod_id)

    async def open(self, cpod_id: str, head: Headers, end: bool, body: bytes | None = None) -> TunnelStream:
        """A stream to the CPod: on a connection held here, else relayed to a replica that holds one.
        ``body``: as ``Session.open`` takes it."""
        local = self._local(cpod_id)
        if local is not None:
            return await local.open(head, end, body)
        if self.held.get(cpod_id):
            raise StreamReset("every tunnel connection of this CPod is full", ErrorCodes.REFUSED_STREAM)
        for url in await asyncio.to_thread(self._holders, cpod_id):
            try:
                session = await self._relay(url)
                return await session.open([*head, (CPOD, cpod_id)], end, body)
            except (OSError, TimeoutError, StreamReset, relay.RelayRefused) as exc:
                log.warning("relay to %s failed: %s", url, exc)
        raise NoTunnel(cpod_id)

    def _local(self, cpod_id: str) -> Session | None:
        """The held connection with the most room for another stream."""
        sessions = [s for s in self.held.get(cpod_id, []) if s.capacity > 0]
        return max(sessions, key=lambda s: s.capacity, default=None)

    # Relays between replicas.
    def relay_token(self) -> str:
        stamp = str(int(time.time()))
        return f"{stamp}.{self.box.mac(RELAY_PURPOSE, stamp.encode()).hex()}"

    def relay_token_valid(self, token: str | None) -> bool:
        stamp, _, digest = (token or "").partition(".")
        if not stamp.isascii() or not stamp.isdigit() or abs(time.time() - int(stamp)) > RELAY_SKEW_S:
            return False
        expected = self.box.mac(RELAY_PURPOSE, stamp.encode()).hex()
        return hmac.compare_digest(expected, digest)

    async def serve_relay(self, transport: Transport) -> None:
        """Another replica's relay connection: each of its streams goes on into a tunnel held here."""
        session = Session(transport, client_side=False, on_stream=self._relayed)
        await session.run()

    async def _relayed(self, incoming: TunnelStream) -> None:
        head = await incoming.head()
        cpod_id = next((v for k, v in head if k == CPOD), "")
        local = self._local(cpod_id)
        if local is None:
            incoming.reset(relay.NOT_HERE)
            return
        whole = incoming.whole_body()  # a request that came with its body goes on the same way
        outgoing = await local.open([(k, v) for k, v in head if k != CPOD], incoming.bodiless, whole)
        if whole and not outgoing.local_ended:
            await outgoing.write(whole)
            await outgoing.end()
        await relay.splice(incoming, outgoing)

    async def _relay(self, url: str) -> Session:
        session = self._relays.get(url)
        if session is not None and session.capacity > 0:
            return session
        transport = await relay.dial(url, self.relay_token())
        session = Session(transport, client_side=True)
        self._relays[url] = session
        task = asyncio.create_task(self._run_relay(url, session), name=f"relay-{url}")
        self._relay_tasks.add(task)
        task.add_done_callback(self._relay_tasks.discard)
        return session

    async def _run_relay(self, url: str, session: Session) -> None:
        try:
            await session.run()
        finally:
            if self._relays.get(url) is session:
                del self._relays[url]

    # The database's record of who holds what.
    def _holders(self, cpod_id: str) -> list[str]:
        fresh = utcnow() - timedelta(seconds=STALE_S)
        with self.db.session() as session:
            rows = session.execute(
                select(TunnelReplica.url)
                .join(TunnelHolder, TunnelHolder.replica == TunnelReplica.replica)
                .where(
                    TunnelHolder.cpod_id == cpod_id,
                    TunnelReplica.replica != self.replica,
                    TunnelReplica.seen_at > fresh,
                    TunnelHolder.connections > 0,
                )
                .order_by(TunnelHolder.connections.desc())
            )
            return [url for (url,) in rows if url]

    async def _record(self, cpod_id: str) -> None:
        count = len(self.held.get(cpod_id, []))
        async with self._record_lock:
            await asyncio.to_thread(self._write, cpod_id, count)

    def _write(self, cpod_id: str, count: int) -> None:
        with self.db.session() as session:
            if session.get(TunnelReplica, self.replica) is None:
                session.add(TunnelReplica(replica=self.replica, url=self.replica_url, seen_at=utcnow()))
                session.flush()
            row = session.get(TunnelHolder, (cpod_id, self.replica))
            if count == 0:
                if row is not None:
                    session.delete(row)
            elif row is None:
                session.add(TunnelHolder(cpod_id=cpod_id, replica=self.replica, connections=count))
            else:
                row.connections = count

    async def renew(self) -> None:
        """Every ``RENEW_S``: this process's row is fresh while it runs (one row, however many
        tunnels it holds), and those of processes gone for ``FORGET_S`` are removed."""
        while True:
            await asyncio.sleep(RENEW_S)
            with contextlib.suppress(Exception):
                async with self._record_lock:
                    await asyncio.to_thread(self._renew)

    def _renew(self) -> None:
        with self.db.session() as session:
            session.execute(
                update(TunnelReplica).where(TunnelReplica.replica == self.replica).values(seen_at=utcnow())
            )
            gone = select(TunnelReplica.replica).where(
                TunnelReplica.seen_at < utcnow() - timedelta(seconds=FORGET_S)
            )
            session.execute(delete(TunnelHolder).where(TunnelHolder.replica.in_(gone)))
            session.execute(delete(TunnelReplica).where(TunnelReplica.replica.in_(gone)))

    async def close(self) -> None:
        """A stopping replica: every tunnel and relay closes (agents re-dial another replica)."""
        sessions = [s for held in self.held.values() for s in held] + list(self._relays.values())
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
        for task in list(self._relay_tasks):
            task.cancel()
        await asyncio.gather(*self._relay_tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self._forget_all)

    def _forget_all(self) -> None:
        with self.db.session() as session:
            session.execute(delete(TunnelHolder).where(TunnelHolder.replica == self.replica))
            session.execute(delete(TunnelReplica).where(TunnelReplica.replica == self.replica))
