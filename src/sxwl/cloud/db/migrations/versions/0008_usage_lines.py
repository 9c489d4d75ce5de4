"""Usage lines: a metering batch posts one ledger transaction per payer and provider, and the
per-attempt detail moves out of the ledger into ``usage_lines`` (docs/billing.md, "Metering").

Every usage transaction written before this revision charged one slice of one attempt; each becomes
the single line of its transaction, its mark read back from its idempotency key
(``usage:<job>:<attempt>:<from>``), and the transaction loses the attempt's columns, which the line
and the attempt now hold. On PostgreSQL ``job_attempts`` gets a fill factor of 50, so a pass that
moves every running attempt's mark rewrites each row in its own page (a HOT update, no index
touched) instead of appending a new version to every index; rows already there move to such
half-full pages the next time they are updated.

Downgrading gives a transaction with one line its attempt's columns back; a batch's transaction
(several lines) keeps its totals and entries, so balances and the ledger check are unchanged, but
the older statement lists it as one line without a job.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# The attempt's columns a usage transaction carried before this revision.
_ATTEMPT_COLUMNS = (
    ("job_id", sa.String(32)),
    ("attempt", sa.Integer()),
    ("cpod_id", sa.String(32)),
    ("resource", sa.String(8)),
    ("gpu_product", sa.String(128)),
    ("units", sa.Integer()),
    ("usage_us", sa.BigInteger()),
    ("unit_price", sa.BigInteger()),
)
# The same SQL on both engines: the mark is what follows "usage:<job>:<attempt>:" in the key.
_LINES_OF_OLD_TRANSACTIONS = sa.text(
    """
    INSERT INTO usage_lines (job_id, attempt, from_us, to_us, gross, net, transaction_id)
    SELECT job_id, attempt, from_us, from_us + usage_us, gross, net, id FROM (
        SELECT id, job_id, attempt, usage_us, gross, net,
               CAST(substr(idempotency_key,
                           length('usage:' || job_id || ':' || CAST(attempt AS VARCHAR) || ':') + 1)
                    AS BIGINT) AS from_us
        FROM ledger_transactions
        WHERE kind = 'usage' AND job_id IS NOT NULL
    ) AS old
    """
)
_LINES = sa.table(
    "usage_lines",
    *(sa.column(name) for name in ("job_id", "attempt", "from_us", "to_us", "transaction_id")),
)
_ATTEMPTS = sa.table(
    "job_attempts",
    *(sa.column(name) for name in ("job_id", "attempt", "cpod_id", "resource", "gpu_product", "units")),
    sa.column("price_per_hour"),
)


def upgrade() -> None:
    op.create_table(
        "usage_lines",
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("from_us", sa.BigInteger, nullable=False),
        sa.Column("to_us", sa.BigInteger, nullable=False),
        sa.Column("gross", sa.BigInteger, nullable=False),
        sa.Column("net", sa.BigInteger, nullable=False),
        sa.Column("transaction_id", sa.String(32), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "attempt", "from_us", name="pk_usage_lines"),
        sa.ForeignKeyConstraint(
            ["job_id", "attempt"],
            ["job_attempts.job_id", "job_attempts.attempt"],
            name="fk_usage_lines_attempt",
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["transaction_id"],
            ["ledger_transactions.id"],
            name="fk_usage_lines_transaction",
            ondelete="RESTRICT",
        ),
    )
    op.create_index("ix_usage_lines_transaction_id", "usage_lines", ["transaction_id"])
    op.execute(_LINES_OF_OLD_TRANSACTIONS)
    # Plain ALTER TABLE … DROP COLUMN on both engines (SQLite ≥ 3.35): a batch would rebuild the
    # table, which the entries' foreign keys forbid. No index names these columns.
    for name, _ in _ATTEMPT_COLUMNS:
        op.execute(f"ALTER TABLE ledger_transactions DROP COLUMN {name}")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE job_attempts SET (fillfactor = 50)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE job_attempts RESET (fillfactor)")
    for name, kind in _ATTEMPT_COLUMNS:
        op.execute(f"ALTER TABLE ledger_transactions ADD COLUMN {name} {kind.compile(op.get_bind().dialect)}")
    transactions = sa.table(
        "ledger_transactions", sa.column("id"), *(sa.column(n) for n, _ in _ATTEMPT_COLUMNS)
    )
    of_tx = _LINES.c.transaction_id == transactions.c.id
    attempt = _LINES.join(
        _ATTEMPTS, (_ATTEMPTS.c.job_id == _LINES.c.job_id) & (_ATTEMPTS.c.attempt == _LINES.c.attempt)
    )
    from_line = {
        "job_id": _LINES.c.job_id,
        "attempt": _LINES.c.attempt,
        "usage_us": _LINES.c.to_us - _LINES.c.from_us,
    }
    from_attempt = {name: _ATTEMPTS.c[name] for name in ("cpod_id", "resource", "gpu_product", "units")} | {
        "unit_price": _ATTEMPTS.c.price_per_hour
    }
    one_line = (
        sa.select(_LINES.c.transaction_id).group_by(_LINES.c.transaction_id).having(sa.func.count() == 1)
    )
    op.execute(
        sa.update(transactions)
        .values(
            {name: sa.select(value).where(of_tx).scalar_subquery() for name, value in from_line.items()}
            | {
                name: sa.select(value).select_from(attempt).where(of_tx).scalar_subquery()
                for name, value in from_attempt.items()
            }
        )
        .where(transactions.c.id.in_(one_line))
    )
    op.drop_index("ix_usage_lines_transaction_id", table_name="usage_lines")
    op.drop_table("usage_lines")
