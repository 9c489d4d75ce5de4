"""The migration to usage lines (docs/billing.md, "Metering"): a ledger from before it, with one
usage transaction per rated slice, keeps every amount and statement line, and downgrading gives
those transactions their attempt's columns back (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import JSON, Connection, column, insert, select, table
from sqlalchemy.orm import Session

from sxwl.cloud.db import migrate
from sxwl.cloud.db.engine import make_engine
from sxwl.cloud.db.models import CPodStatus, Job, Role, User
from sxwl.cloud.db.money_models import UsageLine
from sxwl.cloud.db.types import UTCDateTime
from sxwl.cloud.services.money import billing, ledger
from sxwl.cloud.services.money.ledger import account_key
from sxwl.protocol.money import provider_share

USER, PROVIDER, CPOD, JOB = "u" * 32, "p" * 32, "c" * 32, "j" * 32
PRICE, FEE_BP = 7_200_000, 1000
T0 = datetime(2026, 3, 5, 12, 0, tzinfo=UTC)
# Two slices of one attempt on 2 GPUs, as the per-slice metering posted them: (from, to, gross).
SLICES = ((0, 30_000_000, 120_000), (30_000_000, 90_500_000, 242_000))

# The tables as the revision before usage lines has them.
_TRANSACTIONS = table(
    "ledger_transactions",
    *(column(name) for name in ("id", "idempotency_key", "kind", "payer_id", "provider_id", "job_id")),
    *(column(name) for name in ("attempt", "cpod_id", "resource", "gpu_product", "units", "usage_us")),
    *(column(name) for name in ("unit_price", "gross", "fee", "net")),
    column("created_at", UTCDateTime()),
)
_CPODS = table(
    "cpods",
    *(column(name) for name in ("id", "owner_id", "name", "cluster_uid", "runtime", "agent_version")),
    *(column(name) for name in ("status", "last_seq", "heartbeat_interval_s", "isolation")),
    *(column(name, JSON) for name in ("nodes", "reported_jobs", "trusted_owner_ids")),
    column("created_at", UTCDateTime()),
)
_ACCOUNTS = table("ledger_accounts", *(column(name) for name in ("id", "key", "kind", "owner_id", "balance")))
_ENTRIES = table("ledger_entries", *(column(name) for name in ("transaction_id", "account_id", "amount")))
_ATTEMPTS = table(
    "job_attempts",
    *(column(name) for name in ("job_id", "attempt", "cpod_id", "gpus", "resource", "units", "gpu_product")),
    *(column(name) for name in ("price_per_hour", "fee_bp", "payer_id", "provider_id", "rated_us")),
    *(column(name) for name in ("charged", "earned", "rated_done")),
    column("node_names", JSON),
    *(column(name, UTCDateTime()) for name in ("assigned_at", "started_at", "finished_at", "proven_until")),
)


def _before_usage_lines(config: Config) -> str:
    """The revision that usage lines follow, found by what the migration is named (revision ids are
    renumbered when branches merge)."""
    script = ScriptDirectory.from_config(config)
    (revision,) = (r for r in script.walk_revisions() if r.path.endswith("_usage_lines.py"))
    assert isinstance(revision.down_revision, str)
    return revision.down_revision


def _old_ledger(db: Connection) -> None:
    db.execute(
        insert(User),
        [
            {"id": USER, "email": "u@example.com", "password_hash": "x", "role": Role.USER},
            {"id": PROVIDER, "email": "p@example.com", "password_hash": "x", "role": Role.PROVIDER},
        ],
    )
    db.execute(
        insert(_CPODS).values(
            id=CPOD,
            owner_id=PROVIDER,
            name="c",
            cluster_uid="c",
            runtime="local",
            agent_version="t",
            status=CPodStatus.ONLINE.value,
            last_seq=0,
            heartbeat_interval_s=10.0,
            isolation="isolated",
            nodes=[],
            reported_jobs=[],
            trusted_owner_ids=[],
            created_at=T0,
        )
    )
    db.execute(
        insert(Job).values(
            id=JOB, owner_id=USER, name="t", command=["true"], env={}, gpus_per_node=2, nodes=1
        )
    )
    db.execute(
        insert(_ATTEMPTS).values(
            job_id=JOB,
            attempt=1,
            cpod_id=CPOD,
            gpus=2,
            resource="gpu",
            units=2,
            gpu_product="H200",
            price_per_hour=PRICE,
            fee_bp=FEE_BP,
            payer_id=USER,
            provider_id=PROVIDER,
            rated_us=SLICES[-1][1],
            charged=sum(s[2] for s in SLICES),
            earned=provider_share(sum(s[2] for s in SLICES), FEE_BP),
            rated_done=True,
            node_names=["n0"],
            assigned_at=T0,
            started_at=T0,
            finished_at=T0 + timedelta(seconds=90.5),
            proven_until=T0 + timedelta(seconds=90.5),
        )
    )
    gross = [g for _, _, g in SLICES]
    net = [provider_share(g, FEE_BP) for g in gross]
    # The user's cash, the provider's pending earnings and the platform's fees, with their balances.
    accounts = (
        (account_key(ledger.USER_CASH, USER), ledger.USER_CASH, USER, -sum(gross)),
        (account_key(ledger.PROVIDER_PENDING, PROVIDER), ledger.PROVIDER_PENDING, PROVIDER, sum(net)),
        (account_key(ledger.PLATFORM_FEES), ledger.PLATFORM_FEES, None, sum(gross) - sum(net)),
    )
    db.execute(
        insert(_ACCOUNTS),
        [
            {"id": n, "key": key, "kind": kind, "owner_id": owner, "balance": balance}
            for n, (key, kind, owner, balance) in enumerate(accounts, start=1)
        ],
    )
    for n, (start, end, _) in enumerate(SLICES):
        tx_id = f"{n:032d}"
        db.execute(
            insert(_TRANSACTIONS).values(
                id=tx_id,
                idempotency_key=f"usage:{JOB}:1:{start}",
                kind="usage",
                created_at=T0 + timedelta(seconds=end // 1_000_000),
                payer_id=USER,
                provider_id=PROVIDER,
                job_id=JOB,
                attempt=1,
                cpod_id=CPOD,
                resource="gpu",
                gpu_product="H200",
                units=2,
                usage_us=end - start,
                unit_price=PRICE,
                gross=gross[n],
                fee=gross[n] - net[n],
                net=net[n],
            )
        )
        db.execute(
            insert(_ENTRIES),
            [
                {"transaction_id": tx_id, "account_id": account, "amount": amount}
                for account, amount in ((1, -gross[n]), (2, net[n]), (3, gross[n] - net[n]))
            ],
        )


def test_usage_transactions_become_lines_and_come_back(db_url: str) -> None:
    engine = make_engine(db_url)
    config = migrate.alembic_config(db_url)
    before = _before_usage_lines(config)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, before)
    with engine.begin() as connection:
        _old_ledger(connection)
    migrate.upgrade(engine)
    gross = sum(s[2] for s in SLICES)
    with Session(engine) as session:
        lines = session.execute(
            select(UsageLine.from_us, UsageLine.to_us, UsageLine.gross, UsageLine.transaction_id).order_by(
                UsageLine.from_us
            )
        ).all()
        assert [tuple(line) for line in lines] == [
            (start, end, g, f"{n:032d}") for n, (start, end, g) in enumerate(SLICES)
        ]
        assert ledger.check(session).ok
        (row,) = billing.usage_rows(session, T0, T0 + timedelta(days=1), payer_id=USER)
        assert (row.job_id, row.job_name, row.attempt, row.cpod_id, row.gpu_product) == (
            JOB,
            "t",
            1,
            CPOD,
            "H200",
        )
        assert (row.units, row.usage_us, row.unit_price, row.gross) == (2, 90_500_000, PRICE, gross)
        assert row.fee + row.net == gross and row.net == sum(provider_share(s[2], FEE_BP) for s in SLICES)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, before)
    with engine.connect() as connection:
        restored = connection.execute(
            select(
                *(_TRANSACTIONS.c[n] for n in ("job_id", "attempt", "usage_us", "cpod_id", "units")),
                *(_TRANSACTIONS.c[n] for n in ("unit_price", "gpu_product")),
            ).order_by(_TRANSACTIONS.c.id)
        ).all()
        assert [tuple(r) for r in restored] == [
            (JOB, 1, end - start, CPOD, 2, PRICE, "H200") for start, end, _ in SLICES
        ]
    migrate.upgrade(engine)
    engine.dispose()
