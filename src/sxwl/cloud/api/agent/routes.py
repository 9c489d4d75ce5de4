"""The agent side: register with the accessKey, then everything with the per-CPod token."""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from pydantic import BaseModel
from sqlalchemy.orm import Session

from sxwl.cloud.api.agent import assignment_poll
from sxwl.cloud.api.deps import Ctx, PlainRoute, bearer_token, documented_body, json_body
from sxwl.cloud.api.responses import WITH_BODY, errors, no_store
from sxwl.cloud.api.schemas import AccessKeyCheckOut, CPodBriefOut
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import CPod, Job, JobState
from sxwl.cloud.edge.body_rules import body_rule
from sxwl.cloud.errors import AppError, invalid
from sxwl.cloud.services.catalog import storage_quota
from sxwl.cloud.services.catalog.storage_quota import StorageUsage
from sxwl.cloud.services.fleet import cpod_tokens, cpods
from sxwl.cloud.services.fleet.beat import Beat
from sxwl.cloud.services.jobs import attempt_window, attempts, job_logs, log_archive, upload_tokens
from sxwl.cloud.storage import (
    AlreadyStored,
    Artifact,
    DigestMismatch,
    PathConflict,
    StoreUnavailable,
    TooLarge,
    clean_artifact_path,
    write_checked,
)
from sxwl.protocol import (
    PROTOCOL_HEADER,
    PROTOCOL_VERSION,
    SHA256_HEADER,
    ArtifactRecorded,
    AssignmentsReply,
    Heartbeat,
    HeartbeatReply,
    IsolationReply,
    IsolationReport,
    JobStatus,
    JobStatusReply,
    LogAppendReply,
    RegisterReply,
    RegisterRequest,
    paths,
)
from sxwl.protocol.fields import INT32_MAX, Int32, NonNegInt64, PosInt32
from sxwl.protocol.models import MIN_SUPPORTED_PROTOCOL

router = APIRouter(prefix=paths.AGENT, tags=["agent"], responses=errors(400, 401, 403, 422))
ATTEMPT_ERRORS = errors(404, 409, 413)
UPLOAD_ERRORS = ATTEMPT_ERRORS | errors(503)


def check_protocol(version: int | str | None) -> None:
    if isinstance(version, str):
        # ASCII digits only (str.isdigit() also takes "²", which int() does not), and few of them.
        if not re.fullmatch(r"-?[0-9]{1,10}", version.strip()) or abs(int(version)) > INT32_MAX:
            raise invalid(PROTOCOL_HEADER, f"must be a whole number of at most {INT32_MAX}")
        version = int(version)
    if version is not None and not MIN_SUPPORTED_PROTOCOL <= version <= PROTOCOL_VERSION:
        raise AppError(
            400,
            f"agent protocol {version} is not supported by this cloud (supports {MIN_SUPPORTED_PROTOCOL}"
            f"..{PROTOCOL_VERSION}); install a matching sxwl-agent",
            code="unsupported_protocol",
            details={"supported": [MIN_SUPPORTED_PROTOCOL, PROTOCOL_VERSION], "agent": version},
        )


# The header as FastAPI documents it, for endpoints that read it themselves.
PROTOCOL_PARAMETER = {
    "parameters": [
        {
            "name": PROTOCOL_HEADER,
            "in": "header",
            "required": False,
            "schema": {"type": "integer", "minimum": 0, "maximum": INT32_MAX},
        }
    ]
}


async def protocol_header(
    version: Annotated[Int32 | None, Header(alias=PROTOCOL_HEADER)] = None,
) -> None:
    check_protocol(version)


def current_cpod(request: Request, ctx: Ctx, _: Annotated[None, Depends(protocol_header)]) -> CPod:
    with ctx.db.session() as session:
        return cpods.authenticate(session, bearer_token(request))


CurrentCPod = Annotated[CPod, Depends(current_cpod)]


@router.post(
    paths.REGISTER,
    response_model=RegisterReply,
    dependencies=[Depends(protocol_header), Depends(no_store)],
    responses=WITH_BODY | errors(409),
)
def register(body: RegisterRequest, request: Request, ctx: Ctx) -> RegisterReply:
    """Exchanges the provider's accessKey for this CPod's own token (the accessKey is used only here)."""
    check_protocol(body.protocol_version)
    key = bearer_token(request)
    if key is None:
        raise AppError(401, "accessKey required as the bearer token", headers={"WWW-Authenticate": "Bearer"})
    cpod, token = cpods.register(ctx, key, body)
    return RegisterReply(
        cpod_id=cpod.id,
        cpod_token=token,
        heartbeat_interval_s=cpod.heartbeat_interval_s,
        last_seq=cpod.last_seq,
    )


@router.put(paths.ISOLATION, response_model=IsolationReply)
def isolation(body: IsolationReport, cpod: CurrentCPod, ctx: Ctx) -> IsolationReply:
    """How the agent runs jobs, told at every start; answers whose jobs the CPod may run."""
    with ctx.db.session() as session:
        row = session.get(CPod, cpod.id, with_for_update=True)
        if row is None:  # its provider's account was deleted since the token was checked
            raise AppError(401, "this CPod no longer exists", code="cpod_revoked")
        accepted = cpods.set_isolation(session, row, body)
    return IsolationReply(accepted_owner_ids=None if accepted is None else sorted(accepted))


@router.get(paths.ACCESS_KEY_CHECK, response_model=AccessKeyCheckOut)
def check_access_key(request: Request, ctx: Ctx) -> AccessKeyCheckOut:
    """Lets deployment tools verify an accessKey before touching any host, and watch the provider's
    CPods come online, with nothing but the accessKey."""
    key = bearer_token(request)
    with ctx.db.session() as session:
        owner = cpods.provider_for_access_key(session, key or "")
        if owner is None:
            raise AppError(
                401,
                "accessKey is not valid (wrong, or rotated); copy the current one from the console",
                code="bad_access_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return AccessKeyCheckOut(
            provider=owner.email,
            cpods=[
                CPodBriefOut(id=c.id, name=c.name, status=c.status.value, revoked=c.revoked_at is not None)
                for c, _ in cpods.list_for(session, owner)
            ],
            min_artifact_version=ctx.settings.artifact_min_version,
        )


# Bodies read by json_body, for the OpenAPI document.
DOCUMENTED_BODIES: tuple[type[BaseModel], ...] = (Heartbeat,)


# A heartbeat of a large cluster is big (16 MiB allowed by default); it still arrives in the default time.
@body_rule(lambda s: (s.heartbeat_max_bytes, s.request_body_timeout_s))
async def heartbeat(request: Request) -> Response:
    """The hottest endpoint: parsed and encoded here on the event loop, then authenticated and written
    together with the heartbeats that arrived at the same time (one thread hop and one transaction)."""
    check_protocol(request.headers.get(PROTOCOL_HEADER))
    ctx: CloudContext = request.app.state.ctx
    token = cpod_tokens.required(bearer_token(request))
    body = await json_body(request, Heartbeat)
    if len(body.nodes) > ctx.settings.heartbeat_max_nodes:
        raise invalid("nodes", f"at most {ctx.settings.heartbeat_max_nodes} nodes per heartbeat")
    reply = await ctx.heartbeats.submit(Beat.of(token, body))
    return Response(reply.model_dump_json(), media_type="application/json")


router.add_api_route(
    paths.HEARTBEAT,
    heartbeat,
    methods=["POST"],
    response_model=HeartbeatReply,
    responses=errors(413),
    openapi_extra=documented_body(Heartbeat) | PROTOCOL_PARAMETER,
    route_class_override=PlainRoute,
)


WAIT_PARAMETER = {
    "name": "wait",
    "in": "query",
    "required": False,
    "description": "seconds to hold the request (at most SXWL_LONGPOLL_MAX_S)",
    "schema": {"type": "number", "minimum": 0, "default": 0},
}


async def assignments(request: Request) -> Response:
    """Long-poll: answers as soon as this CPod has a new job attempt or a command, else after ``wait``
    (at most ``SXWL_LONGPOLL_MAX_S``). A long hold is kept open by newlines before the JSON body.
    Every idle CPod renews one of these every few minutes, so it skips FastAPI's machinery too."""
    check_protocol(request.headers.get(PROTOCOL_HEADER))
    ctx: CloudContext = request.app.state.ctx
    wait_s = _seconds("wait", request.query_params.get("wait"))
    token = bearer_token(request)
    cpod_id = await asyncio.to_thread(_authenticated, ctx, token)
    return await assignment_poll.respond(ctx, cpod_id, wait_s)


def _seconds(name: str, raw: str | None) -> float:
    if raw is None:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise invalid(name, "must be a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise invalid(name, "must be a finite number of seconds, at least 0")
    return value


def _authenticated(ctx: CloudContext, token: str | None) -> str:
    query = cpod_tokens.id_query(token := cpod_tokens.required(token))
    cpod_id = None if query is None else ctx.db.scalar(query)
    if cpod_id is None:
        with ctx.db.session() as session:
            raise cpod_tokens.refusal(session, token)
    return cpod_id


router.add_api_route(
    paths.ASSIGNMENTS,
    assignments,
    methods=["GET"],
    response_model=AssignmentsReply,
    openapi_extra={"parameters": [WAIT_PARAMETER, *PROTOCOL_PARAMETER["parameters"]]},
    route_class_override=PlainRoute,
)


@router.post(paths.COMMAND_ACK, status_code=204)
def ack_command(command_id: PosInt32, cpod: CurrentCPod, ctx: Ctx) -> Response:
    with ctx.db.session() as session:
        attempts.ack_command(session, cpod.id, command_id)
    return Response(status_code=204)


@router.post(paths.JOB_STATUS, response_model=JobStatusReply, responses=ATTEMPT_ERRORS)
def job_status(job_id: str, body: JobStatus, cpod: CurrentCPod, ctx: Ctx) -> JobStatusReply:
    state = JobState(body.state)
    with ctx.db.session() as session:
        job = attempts.report_status(
            session, cpod, job_id, body.attempt, state, body.exit_code, body.said(), never_ran=body.never_ran
        )
        return JobStatusReply(state=job.state.value, stop=job.cancel_requested_at is not None)


@router.post(paths.JOB_LOGS, response_model=LogAppendReply, responses=ATTEMPT_ERRORS)
async def append_job_log(
    job_id: str,
    request: Request,
    cpod: CurrentCPod,
    ctx: Ctx,
    attempt: Annotated[PosInt32, Query()],
    offset: Annotated[NonNegInt64, Query()],
) -> LogAppendReply:
    """Appends a chunk of output at a byte offset; bytes already received are skipped, so retries are
    safe. Past the attempt's log cap, bytes are acknowledged and dropped (docs/agent.md, "Protocol")."""
    data = await _read_limited(request, ctx.settings.log_chunk_max_bytes)

    def append() -> job_logs.Appended:
        with ctx.db.session(immediate=True) as session:
            job = attempts.job_for_agent(session, cpod, job_id, attempt)
            return job_logs.append_log(session, ctx.settings, job, attempt, offset, data)

    appended = await asyncio.to_thread(append)
    if appended.archive_due:
        await log_archive.archive(ctx, job_id, attempt)
    return LogAppendReply(next_offset=appended.next_offset)


Sha256 = Annotated[
    str | None,
    Header(
        alias=SHA256_HEADER,
        pattern="^[0-9a-fA-F]{64}$",
        description="sha256 of the file (hex); bytes that differ are refused and nothing is stored",
    ),
]


@router.put(paths.JOB_ARTIFACT, status_code=201, responses=UPLOAD_ERRORS)
# A checkpoint of up to artifact_max_bytes streams in, so it gets its own deadline.
@body_rule(lambda s: (s.artifact_max_bytes, s.artifact_upload_timeout_s))
async def upload_artifact(
    job_id: str,
    path: str,
    request: Request,
    cpod: CurrentCPod,
    ctx: Ctx,
    attempt: Annotated[PosInt32, Query()],
    sha256: Sha256 = None,
) -> ArtifactRecorded:
    """One output file of an attempt this CPod runs (the local runtime's uploads, through JobSync)."""
    return await _put_artifact(
        request,
        ctx,
        job_id,
        attempt,
        path,
        sha256,
        lambda s: attempts.job_for_agent(s, cpod, job_id, attempt),
    )


@router.put(
    paths.UPLOAD_ARTIFACT,
    status_code=201,
    dependencies=[Depends(protocol_header)],
    responses=UPLOAD_ERRORS,
)
@body_rule(lambda s: (s.artifact_max_bytes, s.artifact_upload_timeout_s))
async def upload_pod_artifact(
    job_id: str,
    attempt: PosInt32,
    path: str,
    request: Request,
    ctx: Ctx,
    sha256: Sha256 = None,
) -> ArtifactRecorded:
    """One output file of a Kubernetes pod, put by its uploader with the attempt's upload token: only
    this attempt's artifacts, within its upload window (docs/agent.md, "Artifacts from pods")."""
    upload_tokens.check_token(ctx.box, bearer_token(request), job_id, attempt)
    return await _put_artifact(
        request,
        ctx,
        job_id,
        attempt,
        path,
        sha256,
        lambda s: upload_tokens.job_of_token(s, job_id, attempt),
    )


async def _put_artifact(
    request: Request,
    ctx: Ctx,
    job_id: str,
    attempt: int,
    path: str,
    sha256: str | None,
    job_of: Callable[[Session], Job],
) -> ArtifactRecorded:
    """Streams the body into the store and records it, if ``job_of`` finds the attempt current and
    its upload window open, before the body is read and again when it is recorded. The store writes
    the address once: the same bytes again (a retry after a lost answer) change nothing, other bytes
    are 409 ``artifact_exists``, before the body is read when the attempt recorded the path. The
    owner's storage quota is checked by the declared size first and by the bytes when recorded."""
    try:
        clean = clean_artifact_path(path)
    except ValueError as exc:
        raise invalid("path", str(exc)) from None
    expected = sha256.lower() if sha256 else None

    def check() -> tuple[bool, StorageUsage, int | None]:
        with ctx.db.session() as session:
            job = job_of(session)
            attempt_window.upload_seconds_left(session, job, attempt)
            repeat = attempts.repeats_recorded(session, job, attempt, clean, None, expected)
            declared = request.headers.get("content-length", "")
            size = int(declared) if declared.isascii() and declared.isdigit() else 0
            usage, room = storage_quota.check_artifact(session, ctx.settings, job, clean, size)
            return repeat, usage, room

    repeat, usage, room = await asyncio.to_thread(check)
    limit = ctx.settings.artifact_max_bytes
    stored = Artifact(job_id, attempt, clean)
    try:
        if repeat:  # read to its end, checked, and stored nowhere: it is stored already
            size, digest = await write_checked(request.stream(), None, limit, expected)
        else:
            size, digest = await ctx.artifacts.put(
                stored, request.stream(), limit if room is None else min(limit, room), expected, once=True
            )
    except TooLarge:
        if room is not None and room < limit:
            raise storage_quota.exceeded(usage, room + 1, at_least=True) from None
        raise AppError(
            413, f"artifact larger than {limit} bytes", details={"max_bytes": limit, "path": clean}
        ) from None
    except PathConflict as exc:
        raise AppError(409, str(exc), code="artifact_path_conflict", details={"path": clean}) from None
    except DigestMismatch as exc:
        raise AppError(
            422,
            f"{SHA256_HEADER}: the bytes received hash to {exc.received}, not to the sha256 sent; "
            "nothing was stored",
            code="digest_mismatch",
            details=[{"field": SHA256_HEADER, "message": "does not match the bytes received"}],
        ) from None
    except StoreUnavailable as exc:
        raise store_unavailable(exc) from None
    except AlreadyStored:
        raise attempts.ArtifactExists(job_id, attempt, clean) from None

    def save() -> None:
        with ctx.db.session(immediate=True) as session:
            job = job_of(session)
            attempt_window.upload_seconds_left(session, job, attempt)
            storage_quota.check_recorded(session, ctx.settings, job, clean, size)
            attempts.record_artifact(session, job, attempt, clean, size, digest)

    if not repeat:
        await recording(ctx, stored, save)
    return ArtifactRecorded(path=clean, size=size, sha256=digest)


async def recording(ctx: CloudContext, stored: Artifact, save: Callable[[], None]) -> None:
    """Records an artifact whose bytes are stored; if the owner's quota refuses it there (another
    upload of theirs was recorded meanwhile), its bytes go too: no record will point to them."""
    try:
        await asyncio.to_thread(save)
    except AppError as exc:
        if exc.code == storage_quota.CODE:
            with contextlib.suppress(StoreUnavailable):
                await ctx.artifacts.delete(stored)
        raise


def store_unavailable(exc: StoreUnavailable) -> AppError:
    """A 503 the agent retries later (docs/object-storage.md): nothing was recorded."""
    return AppError(503, f"{exc}; nothing was recorded, try again later", code="artifact_store_unavailable")


async def _read_limited(request: Request, limit: int) -> bytes:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise AppError(413, f"log chunk larger than {limit} bytes", details={"max_bytes": limit})
    return bytes(body)
