"""The capacity cache reads only the CPods that writes marked since its last pass
(services/scheduling/capacity_marks.py, migration 0012), on SQLite and PostgreSQL: whoever writes (plain SQL
included) is seen, an unchanged CPod is not read again, a write that commits after a pass is read by
the next one even when a later transaction committed first, and a deleted CPod leaves the pool."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pytest
from alembic import command
from sqlalchemy import Engine, delete, insert, inspect, select, text, update

from sxwl.cloud.db import migrate
from sxwl.cloud.db.engine import Database
from sxwl.cloud.db.models import CPod, CPodEvent, CPodStatus, Role, User
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.fleet.cpods import set_isolation
from sxwl.cloud.services.scheduling.capacity import CapacityCache
from sxwl.cloud.services.scheduling.placement import Pool
from sxwl.protocol import IsolationReport
from tests.support.cpods import gpu_node

PROVIDER = "p" * 32
CPODS = [f"{i}" * 32 for i in range(4)]


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database(db_url)
    migrate.upgrade(database.engine)
    with database.session() as session:
        session.execute(
            insert(User).values(id=PROVIDER, email="p@example.com", password_hash="x", role=Role.PROVIDER)
        )
        session.execute(
            insert(CPod),
            [
                {
                    "id": cpod_id,
                    "owner_id": PROVIDER,
                    "name": cpod_id[:8],
                    "cluster_uid": cpod_id,
                    "runtime": "local",
                    "takes_endpoints": True,
                    "takes_dev_envs": True,
                    "agent_version": "t",
                    "token_hash": cpod_id,
                    "status": CPodStatus.ONLINE,
                    "last_seq": 1,
                    "last_heartbeat_at": utcnow(),
                    "heartbeat_interval_s": 30.0,
                    "nodes": [gpu_node("w1", count=8)],
                    "reported_jobs": [],
                }
                for cpod_id in CPODS
            ],
        )
    yield database
    database.dispose()


def refresh(db: Database, cache: CapacityCache) -> Pool:
    with db.session() as session:
        return cache.refresh(session)


def free(pool: Pool, cpod_id: str) -> int | None:
    entry = pool.cpods.get(cpod_id)
    return None if entry is None else sum(node.free for node in entry.nodes)


def read_again(cache: CapacityCache, before: Mapping[str, object]) -> set[str]:
    """The CPods the last refresh read from the database: their snapshots are new objects."""
    return {cpod_id for cpod_id, snapshot in cache._snapshots.items() if before.get(cpod_id) is not snapshot}


def test_a_pass_reads_only_what_writes_changed_whoever_wrote_it(db: Database) -> None:
    cache = CapacityCache()
    assert {cpod_id: free(refresh(db, cache), cpod_id) for cpod_id in CPODS} == dict.fromkeys(CPODS, 8)
    before = dict(cache._snapshots)
    refresh(db, cache)
    assert read_again(cache, before) == set()  # nothing written: nothing read

    with db.engine.begin() as connection:  # plain SQL, as an operator might type it
        connection.execute(text("UPDATE cpods SET status = 'offline' WHERE id = :id"), {"id": CPODS[0]})
    with db.session() as session:
        session.execute(update(CPod).where(CPod.id == CPODS[1]).values(nodes=[gpu_node("w1", count=2)]))
        session.execute(update(CPod).where(CPod.id == CPODS[2]).values(last_seq=CPod.last_seq + 1))
    before = dict(cache._snapshots)
    pool = refresh(db, cache)
    assert free(pool, CPODS[0]) is None
    assert free(pool, CPODS[1]) == 2
    # A write of columns the scheduler does not read (the sequence number alone) marks nothing.
    assert read_again(cache, before) == {CPODS[1]}

    with db.session() as session:
        session.execute(update(CPod).where(CPod.id == CPODS[0]).values(status=CPodStatus.ONLINE))
        session.execute(update(CPod).where(CPod.id == CPODS[3]).values(revoked_at=utcnow()))
    pool = refresh(db, cache)
    assert free(pool, CPODS[0]) == 8 and free(pool, CPODS[3]) is None


def test_a_write_that_commits_after_a_pass_is_read_by_the_next(db: Database, db_url: str) -> None:
    """PostgreSQL: an older transaction writes first and commits last, after a newer one and after a
    pass that saw the newer one's write. SQLite runs one writer at a time, so there the older one
    commits before the pass and the newer one after it."""
    cache = CapacityCache()
    refresh(db, cache)
    older = db.engine.connect()
    try:
        older.begin()
        older.execute(update(CPod).where(CPod.id == CPODS[0]).values(nodes=[gpu_node("w1", count=1)]))
        if db_url.startswith("sqlite"):
            older.commit()
        with db.session() as session:
            session.execute(update(CPod).where(CPod.id == CPODS[1]).values(nodes=[gpu_node("w1", count=3)]))
        pool = refresh(db, cache)
        assert free(pool, CPODS[1]) == 3
        if db_url.startswith("postgresql"):
            assert free(pool, CPODS[0]) == 8  # not committed yet
            older.commit()
    finally:
        older.close()
    pool = refresh(db, cache)
    assert (free(pool, CPODS[0]), free(pool, CPODS[1])) == (1, 3)


def test_a_deleted_cpod_leaves_the_pool(db: Database) -> None:
    cache = CapacityCache()
    assert free(refresh(db, cache), CPODS[2]) == 8
    with db.session() as session:
        session.execute(delete(CPod).where(CPod.id == CPODS[2]))
    pool = refresh(db, cache)
    assert free(pool, CPODS[2]) is None and len(pool.cpods) == len(CPODS) - 1


def _triggers(engine: Engine) -> set[str]:
    if engine.dialect.name == "postgresql":
        query = "SELECT tgname FROM pg_trigger WHERE tgrelid = 'cpods'::regclass AND NOT tgisinternal"
    else:
        query = "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'cpods'"
    with engine.connect() as connection:
        return set(connection.execute(text(query)).scalars())


def test_migration_0012_comes_and_goes(db: Database, db_url: str) -> None:
    assert _triggers(db.engine)
    config = migrate.alembic_config(db_url)
    with db.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0011")
    assert "capacity_mark" not in {c["name"] for c in inspect(db.engine).get_columns("cpods")}
    assert _triggers(db.engine) == set()
    migrate.upgrade(db.engine)
    cache = CapacityCache()
    assert free(refresh(db, cache), CPODS[0]) == 8
    with db.session() as session:
        session.execute(update(CPod).where(CPod.id == CPODS[0]).values(nodes=[gpu_node("w1", count=5)]))
    assert free(refresh(db, cache), CPODS[0]) == 5


def test_migration_0013_says_which_cpods_take_fine_tunes_and_marks_a_change(
    db: Database, db_url: str
) -> None:
    config = migrate.alembic_config(db_url)
    with db.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0012")
    assert "takes_fine_tunes" not in {c["name"] for c in inspect(db.engine).get_columns("cpods")}
    assert _triggers(db.engine)  # 0012's triggers, watching what they watched
    with db.session() as session:
        session.execute(update(CPod).where(CPod.id == CPODS[1]).values(runtime="kubernetes"))
    migrate.upgrade(db.engine)
    with db.session() as session:
        taken: dict[str, object] = dict(session.execute(text("SELECT id, takes_fine_tunes FROM cpods")).all())
    assert {k: bool(v) for k, v in taken.items()} == {c: c != CPODS[1] for c in CPODS}
    cache = CapacityCache()
    assert refresh(db, cache).cpods[CPODS[1]].takes_fine_tunes is False
    with db.session() as session:  # the agent's report after a restart with a trainer image
        session.execute(update(CPod).where(CPod.id == CPODS[1]).values(takes_fine_tunes=True))
    assert refresh(db, cache).cpods[CPODS[1]].takes_fine_tunes is True


def test_what_a_kubernetes_agent_says_it_runs_marks_its_cpod_for_the_next_pass(db: Database) -> None:
    """Whether it runs endpoint replicas and dev environments: columns the agent's report at each
    start sets (an event when one changes), whose writes mark the CPod as any watched column does."""
    with db.session() as session:
        kube = {"runtime": "kubernetes", "takes_endpoints": False, "takes_dev_envs": False}
        session.execute(update(CPod).where(CPod.id == CPODS[2]).values(**kube))
    cache = CapacityCache()
    refresh(db, cache)

    def say(cpod_id: str, report: IsolationReport) -> list[str]:
        with db.session() as session:
            cpod = session.get(CPod, cpod_id)
            assert cpod is not None
            set_isolation(session, cpod, report)
        with db.session() as session:
            events = session.scalars(select(CPodEvent).where(CPodEvent.cpod_id == cpod_id))
            return [e.detail.code for e in events if e.detail and e.kind in ("endpoints", "dev-envs")]

    # The agent restarted with an engine image and a dev environment image.
    both = IsolationReport(endpoints=True, dev_envs=True)
    assert say(CPODS[2], both) == ["cpod.endpoints", "cpod.dev_envs"]
    pool = refresh(db, cache)
    assert (pool.cpods[CPODS[2]].takes_endpoints, pool.cpods[CPODS[2]].takes_dev_envs) == (True, True)
    assert len(say(CPODS[2], both)) == 2  # said again at its next start: nothing new
    assert say(CPODS[0], IsolationReport()) == []  # a local agent from before the fields: as it was
    assert say(CPODS[2], IsolationReport(endpoints=True, dev_envs=False))[-1] == "cpod.no_dev_envs"
    pool = refresh(db, cache)
    assert (pool.cpods[CPODS[2]].takes_endpoints, pool.cpods[CPODS[2]].takes_dev_envs) == (True, False)
    assert (pool.cpods[CPODS[0]].takes_endpoints, pool.cpods[CPODS[0]].takes_dev_envs) == (True, True)
