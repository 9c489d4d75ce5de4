"""CPods: registration by accessKey, heartbeats, liveness, and what providers and users see."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Float,
    extract,
    func,
    literal,
    select,
    true,
    type_coerce,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, defer

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import AccessKey, CPod, CPodEvent, CPodStatus, Role, User
from sxwl.cloud.db.types import UTCDateTime, utcnow
from sxwl.cloud.errors import AppError, invalid
from sxwl.cloud.kit.security import ACCESS_KEY_PREFIX, new_token, token_hash
from sxwl.cloud.services.accounts import accounts
from sxwl.cloud.services.fleet import cpod_tokens
from sxwl.cloud.services.jobs import attempts
from sxwl.cloud.services.money.gpu_summary import GpuSummary, add_up, summarize
from sxwl.cloud.services.money.prices import price_book
from sxwl.protocol import IsolationReport, RegisterRequest
from sxwl.protocol.reasons import Reason


def add_event(
    session: Session, cpod_id: str, kind: str, detail: Reason | None = None, actor: User | None = None
) -> None:
    session.add(CPodEvent(cpod_id=cpod_id, kind=kind, detail=detail, actor_id=actor.id if actor else None))


def counted(code: str, n: int) -> Reason:
    """``1 heartbeat missed`` but ``2 heartbeats missed``: the code of one where it has its own words."""
    return Reason.of(f"{code}_one") if n == 1 else Reason.of(code, n=n)


def provider_for_access_key(session: Session, key: str, hold: bool = False) -> User | None:
    """The provider whose *active* accessKey this is; a rotated-away key finds nobody.

    ``hold``: the key stays active until this unit of work ends. On PostgreSQL the key's row is
    locked FOR SHARE, so a rotation's revocation waits for it, or, if the revocation came first,
    this lookup waits and then sees the key revoked. On SQLite the unit of work must have been
    opened with ``immediate=True`` (docs/operations.md, "Only one")."""
    if not key.startswith(ACCESS_KEY_PREFIX):
        return None
    stmt = (
        select(User)
        .join(AccessKey, AccessKey.user_id == User.id)
        .where(AccessKey.key_hash == token_hash(key), AccessKey.revoked_at.is_(None))
    )
    return session.scalar(stmt.with_for_update(read=True, of=AccessKey) if hold else stmt)


def clamp_interval(ctx: CloudContext, wanted: float | None) -> float:
    s = ctx.settings
    return min(max(wanted or s.heartbeat_interval_s, s.heartbeat_interval_min_s), s.heartbeat_interval_max_s)


def default_name(cluster_uid: str) -> str:
    return "cpod-" + hashlib.sha256(cluster_uid.encode()).hexdigest()[:6]


def register(ctx: CloudContext, access_key: str, req: RegisterRequest) -> tuple[CPod, str]:
    """The same provider and cluster_uid always get the same CPod; each registration issues a new
    token (the previous one stops working) and lifts a revocation."""
    for attempt in range(2):
        try:
            with ctx.db.session(immediate=True) as session:
                owner = provider_for_access_key(session, access_key, hold=True)
                if owner is None:
                    raise AppError(
                        401,
                        "accessKey is not valid (wrong, or rotated); copy the current one from the console",
                        code="bad_access_key",
                    )
                return _register(ctx, session, owner, req)
        except IntegrityError:
            # Two registrations of a new cluster raced; the loser finds the winner's row next time.
            if attempt == 1:
                raise
    raise AssertionError("unreachable")


def _register(ctx: CloudContext, session: Session, owner: User, req: RegisterRequest) -> tuple[CPod, str]:
    token = new_token(cpod_tokens.PREFIX)
    interval = clamp_interval(ctx, req.heartbeat_interval_s)
    cpod = session.scalar(
        select(CPod).where(CPod.owner_id == owner.id, CPod.cluster_uid == req.cluster_uid).with_for_update()
    )
    if cpod is None:
        cpod = CPod(
            owner_id=owner.id,
            name=req.name or default_name(req.cluster_uid),
            cluster_uid=req.cluster_uid,
            runtime=req.runtime,
            # No events: "registered" says enough.
            takes_fine_tunes=runs(req.fine_tunes, req.runtime),
            takes_endpoints=runs(req.endpoints, req.runtime),
            takes_dev_envs=runs(req.dev_envs, req.runtime),
            agent_version=req.agent_version,
            token_hash=token_hash(token),
            status=CPodStatus.OFFLINE,
            heartbeat_interval_s=interval,
            last_seq=0,
            nodes=[],
        )
        session.add(cpod)
        session.flush()
        add_event(
            session,
            cpod.id,
            "registered",
            Reason.of("cpod.agent", runtime=req.runtime, version=req.agent_version),
        )
    else:
        was_revoked = cpod.revoked_at is not None
        cpod.token_hash = token_hash(token)
        cpod.revoked_at = None
        cpod.runtime = req.runtime
        cpod.agent_version = req.agent_version
        cpod.heartbeat_interval_s = interval
        again = Reason.of(
            "cpod.again_revoked" if was_revoked else "cpod.again",
            runtime=req.runtime,
            version=req.agent_version,
        )
        add_event(session, cpod.id, "registered", again)
    set_isolation(session, cpod, req)
    return cpod, token


def cached_bytes(cpod: CPod) -> int:
    """The bytes of its agent's last reported input cache."""
    return sum(int(entry.get("size", 0)) for entry in cpod.cached_inputs or ())


def runs(said: bool | None, runtime: str) -> bool:
    """Whether the agent runs a kind of work (fine-tunes, endpoint replicas, dev environments): what
    it said, or for agents from before they said anything, what their runtime did (only the local
    one ran them)."""
    return said if said is not None else runtime == "local"


def set_isolation(session: Session, cpod: CPod, report: IsolationReport) -> frozenset[str] | None:
    """Records how the CPod's agent runs jobs (isolated or not; fine-tunes, endpoint replicas and
    dev environments or not); returns whose jobs it may run (None: anyone's). The scheduler reads
    the columns every pass, so a change counts from the next one."""
    runtime = cpod.runtime
    now = (runs(report.fine_tunes, runtime), runs(report.endpoints, runtime), runs(report.dev_envs, runtime))
    before = (cpod.takes_fine_tunes, cpod.takes_endpoints, cpod.takes_dev_envs)
    for kind, was, takes in zip(("fine_tunes", "endpoints", "dev_envs"), before, now, strict=True):
        if was != takes:  # event "fine-tunes" (…): cpod.fine_tunes or cpod.no_fine_tunes
            code = f"cpod.{kind}" if takes else f"cpod.no_{kind}"
            add_event(session, cpod.id, kind.replace("_", "-"), Reason.of(code))
    cpod.takes_fine_tunes, cpod.takes_endpoints, cpod.takes_dev_envs = now
    trusted: list[str] = []
    if report.isolation == "none":
        for index, email in enumerate(report.trusted_accounts):
            user = accounts.find_by_email(session, _normalized(email, index))
            if user is None:
                raise invalid(f"trusted_accounts[{index}]", f"no account with the email {email}")
            if user.id != cpod.owner_id and user.id not in trusted:
                trusted.append(user.id)
    if (cpod.isolation, cpod.trusted_owner_ids) != (report.isolation, trusted):
        if report.isolation == "isolated":
            detail = Reason.of("cpod.isolated")
        elif report.trusted_accounts:
            detail = Reason.of("cpod.not_isolated", emails=", ".join(report.trusted_accounts))
        else:
            detail = Reason.of("cpod.not_isolated_alone")
        add_event(session, cpod.id, "isolation", detail)
        cpod.isolation, cpod.trusted_owner_ids = report.isolation, trusted
    return cpod.takes_only()


def _normalized(email: str, index: int) -> str:
    try:
        return accounts.normalize_email(email)
    except ValueError as exc:
        raise invalid(f"trusted_accounts[{index}]", str(exc)) from None


def cpod_for_token(session: Session, token: str) -> CPod | None:
    """The CPod of this token, without its node snapshot: authenticating a heartbeat must not read
    and decode the very document the heartbeat replaces."""
    hashed = cpod_tokens.hash_of(token)
    if hashed is None:
        return None
    return session.scalar(
        select(CPod).options(defer(CPod.nodes, raiseload=True)).where(*cpod_tokens.live(hashed))
    )


def authenticate(session: Session, token: str | None) -> CPod:
    """The calling CPod; 401 for no or a revoked token, 403 for a user's token on agent endpoints."""
    token = cpod_tokens.required(token)
    cpod = cpod_for_token(session, token)
    if cpod is None:
        raise cpod_tokens.refusal(session, token)
    return cpod


def sweep_liveness(
    ctx: CloudContext, now: datetime | None = None, watching_since: datetime | None = None
) -> list[tuple[str, CPodStatus]]:
    """Moves CPods that missed heartbeats: online → unknown after N missed intervals, unknown →
    offline after the grace. Intervals are counted from the later of the last heartbeat and
    ``watching_since`` (when this cloud process started), so the cloud's own downtime is never
    blamed on the CPods. Each move is a conditional update, so replicas sweeping at once record each
    transition once. Returns the transitions made."""
    now = now or utcnow()
    s = ctx.settings
    moved: list[tuple[str, CPodStatus]] = []
    with ctx.db.session() as session:
        rows = session.execute(
            select(CPod.id, CPod.status, CPod.last_heartbeat_at, CPod.heartbeat_interval_s)
            .where(
                CPod.status.in_([CPodStatus.ONLINE, CPodStatus.UNKNOWN]),
                CPod.revoked_at.is_(None),
                CPod.last_heartbeat_at.is_not(None),
                # Only the overdue: both moves below need missed >= N, i.e. now - since >= N
                # intervals, and since >= last, so now - last >= N intervals too. The second of
                # slack outweighs SQLite's millisecond julianday and float rounding, so this drops
                # only rows the loop would skip; an idle fleet that beats on time reads no row.
                _seconds_since_heartbeat(session, now) + _SLACK_S
                >= CPod.heartbeat_interval_s * s.unknown_after_missed,
            )
            # Rows locked in id order, as heartbeat batches lock them: neither waits on the other.
            .order_by(CPod.id)
        ).all()
        for cpod_id, status, last, interval in rows:
            if last is None:
                continue
            since = max(last, watching_since) if watching_since else last
            missed = int((now - since).total_seconds() // interval)
            if status == CPodStatus.ONLINE and missed >= s.unknown_after_missed:
                target = CPodStatus.UNKNOWN
            elif missed >= s.unknown_after_missed and now - since >= timedelta(
                seconds=interval * s.unknown_after_missed + s.offline_grace_s
            ):
                target = CPodStatus.OFFLINE
            else:
                continue
            changed = session.execute(
                update(CPod)
                .where(CPod.id == cpod_id, CPod.status == status, CPod.last_heartbeat_at == last)
                .values(status=target)
                .execution_options(synchronize_session=False)
            )
            if changed.rowcount == 1:  # type: ignore[attr-defined]
                add_event(session, cpod_id, target.value, counted("cpod.missed", missed))
                moved.append((cpod_id, target))
                if target == CPodStatus.OFFLINE:
                    attempts.requeue_cpod_jobs(session, cpod_id, Reason.of("job.cpod_offline", cpod=cpod_id))
    return moved


_SLACK_S = 1.0


def _seconds_since_heartbeat(session: Session, now: datetime) -> ColumnElement[float]:
    """``now - last_heartbeat_at`` in seconds, computed by the database: SQLite stores UTCDateTime
    as ISO text (julianday reads it, to the millisecond), PostgreSQL as timestamptz."""
    at = literal(now, UTCDateTime())
    if session.get_bind().dialect.name == "postgresql":
        return type_coerce(extract("epoch", at - CPod.last_heartbeat_at), Float())
    return (func.julianday(at) - func.julianday(CPod.last_heartbeat_at)) * 86400.0


# ---- what people see -------------------------------------------------------------------------


def visible_to(user: User) -> Any:
    """The WHERE clause of the CPods this user may see."""
    return true() if user.role == Role.ADMIN else CPod.owner_id == user.id


def list_for(session: Session, user: User) -> list[tuple[CPod, str]]:
    if user.role == Role.USER:
        raise AppError(
            403,
            "CPods are shown to their providers; the GPUs free to you are on the console's Available GPUs "
            "page (/gpus) and in `sxwl gpu-types`",
        )
    rows = session.execute(
        select(CPod, User.email)
        .join(User, CPod.owner_id == User.id)
        .where(visible_to(user))
        .order_by(CPod.created_at)
    ).all()
    return [(cpod, email) for cpod, email in rows]


def get_for(session: Session, user: User, cpod_id: str, for_update: bool = False) -> CPod:
    stmt = select(CPod).where(CPod.id == cpod_id)
    cpod = session.scalar(stmt.with_for_update() if for_update else stmt)
    if cpod is None:
        raise AppError(404, f"no CPod {cpod_id}")
    if user.role != Role.ADMIN and cpod.owner_id != user.id:
        raise AppError(403, "this CPod belongs to another provider")
    return cpod


def rename(session: Session, user: User, cpod_id: str, name: str) -> CPod:
    cpod = get_for(session, user, cpod_id, for_update=True)
    if cpod.name != name:
        add_event(session, cpod.id, "renamed", Reason.of("cpod.renamed", old=cpod.name, new=name), actor=user)
        cpod.name = name
    return cpod


def revoke(session: Session, user: User, cpod_id: str) -> CPod:
    """Its token stops working at once; the agent is told on its next call (401) and stops."""
    cpod = get_for(session, user, cpod_id, for_update=True)
    if cpod.revoked_at is None:
        cpod.revoked_at = utcnow()
        cpod.token_hash = None
        cpod.status = CPodStatus.OFFLINE
        add_event(session, cpod.id, "revoked", None, actor=user)
        attempts.requeue_cpod_jobs(session, cpod.id, Reason.of("job.cpod_revoked", cpod=cpod.id))
    return cpod


def events(session: Session, cpod_id: str, limit: int = 50) -> list[tuple[CPodEvent, str | None]]:
    rows = session.execute(
        select(CPodEvent, User.email)
        .outerjoin(User, CPodEvent.actor_id == User.id)
        .where(CPodEvent.cpod_id == cpod_id)
        .order_by(CPodEvent.id.desc())
        .limit(limit)
    ).all()
    return [(event, email) for event, email in rows]


def gpu_types(session: Session) -> list[GpuSummary]:
    """GPUs per product, summed over online CPods: what compute users may ask for."""
    rows = session.scalars(
        select(CPod.nodes).where(CPod.status == CPodStatus.ONLINE, CPod.revoked_at.is_(None))
    )
    book = price_book(session)
    return [
        line.model_copy(
            update={"price_per_hour": rate.price_per_hour if (rate := book.gpu.get(line.product)) else None}
        )
        for line in add_up(line for nodes in rows for line in summarize(nodes))
    ]


def fine_tune_gpus(session: Session) -> int:
    """The most GPUs a fine-tune (one node) could have on an online CPod that runs fine-tunes: 0
    where none has a ready node with GPUs, and a fine-tune fits only on CPUs."""
    rows = session.scalars(
        select(CPod.nodes).where(
            CPod.status == CPodStatus.ONLINE, CPod.revoked_at.is_(None), CPod.takes_fine_tunes.is_(True)
        )
    )
    gpus = (node.get("gpu") for nodes in rows for node in nodes if node.get("status") == "ready")
    return max((int(gpu["allocatable"]) for gpu in gpus if gpu), default=0)
