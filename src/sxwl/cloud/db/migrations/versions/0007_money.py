"""Money: prices, attempts' fixed prices and rating marks, and the double-entry ledger.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sxwl.cloud.db.types import UTCDateTime

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def _users_fk(name: str, table: str | None = None) -> sa.Column[str]:
    # Added to an existing table (SQLite rebuilds it in a batch), a foreign key needs a name.
    fk_name = f"fk_{table}_{name}" if table else None
    return sa.Column(name, sa.String(32), sa.ForeignKey("users.id", ondelete="SET NULL", name=fk_name))


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("cancel_reason", sa.String(200)))
    with op.batch_alter_table("agent_commands") as batch:
        batch.add_column(sa.Column("grace_s", sa.Float))
    with op.batch_alter_table("cpods") as batch:
        batch.add_column(sa.Column("offered_until", UTCDateTime()))
    op.create_table(
        "gpu_offers",
        sa.Column("cpod_id", sa.String(32), sa.ForeignKey("cpods.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("day", sa.String(10), primary_key=True),
        sa.Column("gpu_product", sa.String(128), primary_key=True),
        sa.Column("gpu_us", sa.BigInteger, nullable=False),
    )
    # Attempts placed before prices existed were never priced: they are rated as done, at zero.
    with op.batch_alter_table("job_attempts") as batch:
        batch.add_column(sa.Column("resource", sa.String(8), nullable=False, server_default="gpu"))
        batch.add_column(sa.Column("units", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("gpu_product", sa.String(128)))
        batch.add_column(sa.Column("price_per_hour", sa.BigInteger, nullable=False, server_default="0"))
        batch.add_column(sa.Column("fee_bp", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(_users_fk("payer_id", "job_attempts"))
        batch.add_column(_users_fk("provider_id", "job_attempts"))
        batch.add_column(sa.Column("proven_until", UTCDateTime()))
        batch.add_column(sa.Column("rated_us", sa.BigInteger, nullable=False, server_default="0"))
        batch.add_column(sa.Column("charged", sa.BigInteger, nullable=False, server_default="0"))
        batch.add_column(sa.Column("earned", sa.BigInteger, nullable=False, server_default="0"))
        batch.add_column(sa.Column("rated_done", sa.Boolean, nullable=False, server_default=sa.true()))
    op.create_index(
        "ix_job_attempts_unrated",
        "job_attempts",
        ["started_at"],
        sqlite_where=sa.text("rated_done = 0"),
        postgresql_where=sa.text("NOT rated_done"),
    )
    op.create_table(
        "prices",
        sa.Column("resource", sa.String(16), primary_key=True),
        sa.Column("product", sa.String(128), primary_key=True),
        sa.Column("price_per_hour", sa.BigInteger, nullable=False),
        sa.Column("fee_bp", sa.Integer, nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        _users_fk("updated_by_id"),
    )
    op.create_table(
        "price_changes",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("resource", sa.String(8), nullable=False),
        sa.Column("product", sa.String(128), nullable=False),
        sa.Column("price_per_hour", sa.BigInteger),
        sa.Column("fee_bp", sa.Integer),
        sa.Column("at", UTCDateTime(), nullable=False),
        _users_fk("actor_id"),
    )
    op.create_table(
        "ledger_accounts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("key", sa.String(64), nullable=False, unique=True),
        sa.Column("kind", sa.String(24), nullable=False),
        _users_fk("owner_id"),
        sa.Column("balance", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_ledger_accounts_owner_id", "ledger_accounts", ["owner_id"])
    op.create_table(
        "ledger_transactions",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("idempotency_key", sa.String(128), nullable=False, unique=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        _users_fk("actor_id"),
        sa.Column("note", sa.String(500)),
        sa.Column("payer_id", sa.String(32)),
        sa.Column("provider_id", sa.String(32)),
        sa.Column("job_id", sa.String(32)),
        sa.Column("attempt", sa.Integer),
        sa.Column("cpod_id", sa.String(32)),
        sa.Column("resource", sa.String(8)),
        sa.Column("gpu_product", sa.String(128)),
        sa.Column("units", sa.Integer),
        sa.Column("usage_us", sa.BigInteger),
        sa.Column("unit_price", sa.BigInteger),
        sa.Column("gross", sa.BigInteger, nullable=False),
        sa.Column("fee", sa.BigInteger, nullable=False),
        sa.Column("net", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_ledger_tx_payer", "ledger_transactions", ["payer_id", "created_at"])
    op.create_index("ix_ledger_tx_provider", "ledger_transactions", ["provider_id", "created_at"])
    op.create_index("ix_ledger_tx_kind", "ledger_transactions", ["kind", "created_at"])
    op.create_table(
        "ledger_entries",
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True
        ),
        sa.Column(
            "transaction_id",
            sa.String(32),
            sa.ForeignKey("ledger_transactions.id", ondelete="RESTRICT"),
            nullable=False,
        ),
        sa.Column(
            "account_id", sa.Integer, sa.ForeignKey("ledger_accounts.id", ondelete="RESTRICT"), nullable=False
        ),
        sa.Column("amount", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_ledger_entries_transaction_id", "ledger_entries", ["transaction_id"])
    op.create_index("ix_ledger_entries_account_id", "ledger_entries", ["account_id"])


def downgrade() -> None:
    op.drop_table("gpu_offers")
    with op.batch_alter_table("cpods") as batch:
        batch.drop_column("offered_until")
    for table in ("ledger_entries", "ledger_transactions", "ledger_accounts", "price_changes", "prices"):
        op.drop_table(table)
    op.drop_index("ix_job_attempts_unrated", "job_attempts")
    with op.batch_alter_table("job_attempts") as batch:
        for column in (
            "rated_done",
            "earned",
            "charged",
            "rated_us",
            "proven_until",
            "provider_id",
            "payer_id",
            "fee_bp",
            "price_per_hour",
            "gpu_product",
            "units",
            "resource",
        ):
            batch.drop_column(column)
    with op.batch_alter_table("agent_commands") as batch:
        batch.drop_column("grace_s")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("cancel_reason")
