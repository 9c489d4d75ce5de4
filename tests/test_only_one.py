""" "Only one" rules under concurrent requests, on SQLite and PostgreSQL: one active accessKey per
provider (and a rotated-away key registers nothing, even mid-rotation), one CPod per provider and
cluster uid, one account per email, one row per job attempt and one open attempt per job. Real
threads against the real app and database; every loser gets a clean 4xx, never a 500."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, Generic, TypeVar

import httpx
import pytest
from alembic import command
from fastapi.testclient import TestClient
from sqlalchemy import JSON, column, delete, func, insert, select, table
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db import migrate
from sxwl.cloud.db.engine import make_engine
from sxwl.cloud.db.models import AccessKey, Artifact, CPod, CPodStatus, Job, JobAttempt, JobState, Role, User
from sxwl.cloud.db.types import UTCDateTime, utcnow
from sxwl.cloud.kit.security import token_hash
from sxwl.cloud.services.accounts import access_keys
from sxwl.cloud.services.fleet import cpods
from sxwl.cloud.services.jobs import attempts
from sxwl.cloud.services.scheduling import scheduler
from tests.conftest import MakeSettings, login, register
from tests.support.cpods import A100, access_key, beat, gpu_node

N = 8
T = TypeVar("T")


def at_once(count: int, work: Callable[[int], T]) -> list[T]:
    """``work(0..count-1)`` in ``count`` threads released together; their results, in order."""
    gate = threading.Barrier(count)
    results: list[Any] = [None] * count

    def run(i: int) -> None:
        gate.wait()
        try:
            results[i] = work(i)
        except BaseException as error:  # re-raised in the test's own thread below
            results[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def ctx_of(client: TestClient) -> CloudContext:
    ctx: CloudContext = client.app.state.ctx  # type: ignore[attr-defined]
    return ctx


def active_keys(ctx: CloudContext) -> list[AccessKey]:
    with ctx.db.session() as session:
        return list(session.scalars(select(AccessKey).where(AccessKey.revoked_at.is_(None))))


def new_cpod(owner_id: str, cluster_uid: str, nodes: list[dict[str, Any]] | None = None) -> CPod:
    """An online CPod row, written the way a registration and a first heartbeat would leave it."""
    return CPod(
        owner_id=owner_id,
        name=cluster_uid,
        cluster_uid=cluster_uid,
        runtime="local",
        agent_version="test",
        status=CPodStatus.ONLINE,
        last_seq=1,
        last_heartbeat_at=utcnow(),
        heartbeat_interval_s=30.0,
        nodes=nodes or [],
        reported_jobs=[],
    )


def try_register(client: TestClient, key: str, cluster_uid: str) -> httpx.Response:
    response: httpx.Response = client.post(
        "/api/v1/agent/register",
        headers={"Authorization": f"Bearer {key}"},
        json={"cluster_uid": cluster_uid, "runtime": "local", "agent_version": "test"},
    )
    return response


@pytest.fixture
def provider(client: TestClient) -> tuple[dict[str, str], str]:
    register(client, "owner@example.com")
    headers = login(client, "owner@example.com")
    return headers, access_key(client, headers)


# ---- one active accessKey --------------------------------------------------------------------


def test_concurrent_rotations_leave_one_active_key_and_old_keys_register_nothing(
    client: TestClient, provider: tuple[dict[str, str], str]
) -> None:
    headers, original = provider
    answers = at_once(N, lambda _: client.post("/api/v1/me/access-key/rotate", headers=headers))
    assert [a.status_code for a in answers] == [200] * N, [a.text for a in answers]
    issued = [a.json()["access_key"] for a in answers]
    assert len(set(issued)) == N

    (current,) = active_keys(ctx_of(client))
    (winner,) = [key for key in issued if current.key_hash == token_hash(key)]
    assert client.get("/api/v1/me/access-key", headers=headers).json()["access_key"] == winner
    for i, key in enumerate([original, *issued]):
        if key != winner:
            refused = try_register(client, key, f"cluster-{i}")
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "bad_access_key"
    assert try_register(client, winner, "cluster-w").status_code == 200


def test_concurrent_first_reveals_issue_one_key(
    client: TestClient, provider: tuple[dict[str, str], str]
) -> None:
    """A provider from before keys existed gets one on first sight; at once, still only one."""
    headers, _ = provider
    ctx = ctx_of(client)
    with ctx.db.session() as session:
        session.execute(delete(AccessKey))
    answers = at_once(N, lambda _: client.get("/api/v1/me/access-key", headers=headers))
    codes = [a.status_code for a in answers]
    assert set(codes) <= {200, 409} and 200 in codes, [a.text for a in answers]
    assert all(a.json()["error"]["code"] == "access_key_conflict" for a in answers if a.status_code == 409)
    (current,) = active_keys(ctx)
    assert {a.json()["access_key"] for a in answers if a.status_code == 200} == {
        ctx.box.decrypt(current.key_encrypted)
    }


class Pause(Generic[T]):
    """A unit of work in its own thread: ``first``, then a wait for ``commit()``, then ``then``."""

    def __init__(self, ctx: CloudContext, first: Callable[[Session], T], immediate: bool = False) -> None:
        self.started, self.release = threading.Event(), threading.Event()
        self.then: Callable[[Session], object] = lambda _: None
        self.errors: list[BaseException] = []

        def run() -> None:
            try:
                with ctx.db.session(immediate=immediate) as session:
                    self.result = first(session)
                    self.started.set()
                    self.release.wait(30)
                    self.then(session)
            except BaseException as error:  # re-raised in the test's own thread by commit()
                self.errors.append(error)
                self.started.set()

        self.thread = threading.Thread(target=run)
        self.thread.start()
        assert self.started.wait(30)

    def commit(self, then: Callable[[Session], object] | None = None) -> None:
        if then is not None:
            self.then = then
        self.release.set()
        self.thread.join(30)
        if self.errors:
            raise self.errors[0]


def call_in_thread(work: Callable[[], T]) -> tuple[threading.Thread, list[T]]:
    out: list[T] = []
    thread = threading.Thread(target=lambda: out.append(work()))
    thread.start()
    return thread, out


def test_a_registration_waits_for_an_uncommitted_rotation_and_is_refused(
    client: TestClient, provider: tuple[dict[str, str], str]
) -> None:
    """The revocation has been written but not committed when the registration looks the key up."""
    _, old = provider
    ctx = ctx_of(client)
    with ctx.db.session() as session:
        owner_id = session.scalars(select(User.id)).one()

    def rotate(session: Session) -> str:
        owner = session.get_one(User, owner_id)
        return access_keys.rotate(ctx, session, owner, owner)

    rotation = Pause(ctx, rotate)
    registering, answer = call_in_thread(lambda: try_register(client, old, "cluster-late"))
    registering.join(0.5)
    assert registering.is_alive(), "the registration read the key before the rotation committed"
    rotation.commit()
    registering.join(30)
    assert answer[0].status_code == 401 and answer[0].json()["error"]["code"] == "bad_access_key"
    with ctx.db.session() as session:
        assert session.scalar(select(func.count()).select_from(CPod)) == 0
    assert try_register(client, rotation.result, "cluster-late").status_code == 200


def test_a_rotation_waits_for_a_registration_holding_the_key(
    client: TestClient, provider: tuple[dict[str, str], str]
) -> None:
    """The other order: the registration found the key active and writes its CPod (a foreign-key
    check on the provider's row) while the rotation waits; neither deadlocks, both succeed."""
    headers, old = provider
    ctx = ctx_of(client)

    def hold(session: Session) -> User:
        owner = cpods.provider_for_access_key(session, old, hold=True)
        assert owner is not None
        return owner

    registration = Pause(ctx, hold, immediate=True)
    rotating, answer = call_in_thread(lambda: client.post("/api/v1/me/access-key/rotate", headers=headers))
    rotating.join(0.5)
    assert rotating.is_alive(), "the key was revoked while a registration held it"
    registration.commit(then=lambda session: session.add(new_cpod(registration.result.id, "cluster-held")))
    rotating.join(30)
    assert answer[0].status_code == 200, answer[0].text
    with ctx.db.session() as session:
        assert session.scalars(select(CPod.cluster_uid)).all() == ["cluster-held"]
    assert try_register(client, old, "cluster-x").status_code == 401


# ---- one CPod per provider and cluster uid ---------------------------------------------------


def test_concurrent_first_registrations_of_one_cluster_make_one_cpod(
    client: TestClient, provider: tuple[dict[str, str], str]
) -> None:
    _, key = provider
    answers = at_once(N, lambda _: try_register(client, key, "cluster-same"))
    assert [a.status_code for a in answers] == [200] * N, [a.text for a in answers]
    assert len({a.json()["cpod_id"] for a in answers}) == 1
    with ctx_of(client).db.session() as session:
        assert session.scalar(select(func.count()).select_from(CPod)) == 1
    # Each registration issued a new token; only the last one committed still speaks for the CPod.
    working = [a for i, a in enumerate(answers) if beat(client, a.json()["cpod_token"], i + 1, []).is_success]
    assert len(working) == 1


# ---- one account per email -------------------------------------------------------------------


def test_concurrent_sign_ups_with_one_email_make_one_account(make_client: Callable[..., TestClient]) -> None:
    client = make_client(rate_register_ip="100/60", rate_register_account="100/60")
    answers = at_once(
        N,
        lambda i: client.post(
            "/api/v1/auth/register",
            json={
                "email": f"{'Same' if i % 2 else 'same'}@example.com",
                "password": "correct horse",
                "role": "provider",
            },
        ),
    )
    codes = sorted(a.status_code for a in answers)
    assert codes == [201] + [409] * (N - 1), [a.text for a in answers]
    assert {a.json()["error"]["code"] for a in answers if a.status_code == 409} == {"email_taken"}
    with ctx_of(client).db.session() as session:
        assert session.scalar(select(func.count()).select_from(User)) == 1


# ---- job attempts ----------------------------------------------------------------------------


@pytest.fixture
def queued_job(make_settings: MakeSettings) -> Iterator[tuple[CloudContext, str]]:
    """One queued job that fits the one online CPod, and no app whose own scheduler could place it."""
    ctx = CloudContext.from_settings(make_settings())
    migrate.upgrade(ctx.db.engine)
    with ctx.db.session() as session:
        session.execute(
            insert(User),
            [
                {"id": "p" * 32, "email": "p@example.com", "password_hash": "x", "role": Role.PROVIDER},
                {"id": "u" * 32, "email": "u@example.com", "password_hash": "x", "role": Role.USER},
            ],
        )
        cpod = new_cpod("p" * 32, "c", nodes=[gpu_node("w1", count=8)])
        job = Job(
            owner_id="u" * 32,
            name="j",
            command=["true"],
            env={},
            gpu_product=A100["product"],
            gpus_per_node=1,
            nodes=1,
            state=JobState.QUEUED,
            attempt=0,
            node_names=[],
        )
        session.add_all([cpod, job])
        session.flush()
        job_id = job.id
    yield ctx, job_id
    ctx.db.dispose()


def test_concurrent_scheduling_passes_of_replicas_place_a_job_once(
    queued_job: tuple[CloudContext, str],
) -> None:
    ctx, job_id = queued_job
    replicas = [CloudContext.from_settings(ctx.settings) for _ in range(N)]  # each its own cache
    placed = at_once(N, lambda i: scheduler.schedule_once(replicas[i]))
    assert sum(len(p) for p in placed) == 1
    with ctx.db.session() as session:
        job = session.get_one(Job, job_id)
        assert (job.state, job.attempt) == (JobState.ASSIGNED, 1)
        assert session.scalars(select(JobAttempt.attempt).where(JobAttempt.job_id == job_id)).all() == [1]
    for replica in replicas:
        replica.db.dispose()


def test_the_database_refuses_a_second_row_or_a_second_open_attempt(
    queued_job: tuple[CloudContext, str],
) -> None:
    """Attempt rows written at once, the same number and then different numbers: one of each wins."""
    ctx, job_id = queued_job

    def add(attempt: int) -> bool:
        try:
            with ctx.db.session() as session:
                session.add(JobAttempt(job_id=job_id, attempt=attempt, node_names=["w1"], gpus=1))
        except IntegrityError:
            return False
        return True

    assert sum(at_once(N, lambda _: add(1))) == 1
    assert sum(at_once(N, lambda i: add(2 + i))) == 0  # attempt 1 is still open
    with ctx.db.session() as session:
        session.get_one(JobAttempt, (job_id, 1)).finished_at = utcnow()
    assert sum(at_once(N, lambda i: add(2 + i))) == 1
    with ctx.db.session() as session:
        open_rows = session.scalar(
            select(func.count()).select_from(JobAttempt).where(JobAttempt.finished_at.is_(None))
        )
        assert open_rows == 1


# ---- databases from before the rules were the database's -------------------------------------


def test_migration_0005_keeps_the_newest_active_key_and_the_latest_open_attempt(db_url: str) -> None:
    """Duplicates an older cloud could have written are resolved the same way every time."""
    engine = make_engine(db_url)
    config = migrate.alembic_config(db_url)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0004")
    t0 = utcnow()
    with engine.begin() as connection:
        connection.execute(
            insert(User),
            [
                {"id": f"{who}" * 32, "email": f"{who}@example.com", "password_hash": "x", "role": role}
                for who, role in (("a", Role.PROVIDER), ("b", Role.PROVIDER), ("u", Role.USER))
            ],
        )
        keys = [("a", "1", 0), ("a", "3", 2), ("a", "2", 2), ("a", "0", 1), ("b", "4", 0)]
        connection.execute(
            insert(AccessKey),
            [
                {
                    "id": key_id * 32,
                    "user_id": who * 32,
                    "key_hash": key_id * 64,
                    "key_encrypted": "x",
                    "hint": key_id,
                    "created_at": t0 + timedelta(seconds=age),
                }
                for who, key_id, age in keys
            ],
        )
        connection.execute(
            insert(Job).values(
                id="j" * 32, owner_id="u" * 32, name="j", command=["true"], env={}, gpus_per_node=1, nodes=1
            )
        )
        # The table as revision 0004 has it: the model's later columns (and their defaults) are not there yet.
        attempts_0004 = table(
            "job_attempts",
            column("job_id"),
            column("attempt"),
            column("node_names", JSON),
            column("gpus"),
            column("assigned_at", UTCDateTime()),
        )
        connection.execute(
            insert(attempts_0004),
            [
                {"job_id": "j" * 32, "attempt": n, "node_names": [], "gpus": 1, "assigned_at": t0}
                for n in (2, 3, 1)
            ],
        )
    migrate.upgrade(engine)
    with engine.connect() as connection:
        active = connection.execute(
            select(AccessKey.user_id, AccessKey.id).where(AccessKey.revoked_at.is_(None))
        ).all()
        # The newest; of two equally new keys, the greater id.
        assert sorted(active) == [("a" * 32, "3" * 32), ("b" * 32, "4" * 32)]
        attempts = connection.execute(
            select(JobAttempt.attempt, JobAttempt.outcome, JobAttempt.finished_at.is_(None)).order_by(
                JobAttempt.attempt
            )
        ).all()
        assert attempts == [(1, "lost", False), (2, "lost", False), (3, None, True)]
    engine.dispose()


def test_concurrent_records_of_one_artifact_path_keep_one_row(queued_job: tuple[CloudContext, str]) -> None:
    ctx, job_id = queued_job

    def record(i: int) -> bool:
        try:
            with ctx.db.session() as session:
                attempts.record_artifact(
                    session, session.get_one(Job, job_id), 1, "out/model.bin", i, f"{i:064x}"
                )
        except attempts.ArtifactExists:
            return False  # an attempt's artifact is written once: the others' bytes are refused
        return True

    recorded = at_once(N, record)
    with ctx.db.session() as session:
        (row,) = session.scalars(select(Artifact).where(Artifact.job_id == job_id)).all()
        assert row.sha256 == f"{row.size:064x}"  # one upload's record, whole
    assert [i for i, won in enumerate(recorded) if won] == [row.size]
