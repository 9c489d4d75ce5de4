"""Cores, memory and storage of dev environments (docs/dev-envs.md, docs/billing.md): ``cpus`` and
``memory_mib`` on ``jobs`` (what an attempt asks for per node, passed to its runtime and used to
place it), ``cpus`` and ``memory_gib`` on ``dev_envs`` (what each of its jobs asks for), and
``storage_charges``, one row per environment and UTC day its saved workspace was charged for, keyed
so that a day is charged once whichever replica charges it; ``dev_envs.workspace_forgotten_at``
(when a stopped environment's CPod was told to remove its workspace) and
``agent_commands.workspace`` (the environment such a ``forget_workspace`` command names).

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("cpus", sa.Integer, nullable=True))
    op.add_column("jobs", sa.Column("memory_mib", sa.Integer, nullable=True))
    op.add_column("dev_envs", sa.Column("cpus", sa.Integer, nullable=True))
    op.add_column("dev_envs", sa.Column("memory_gib", sa.Integer, nullable=True))
    op.add_column("dev_envs", sa.Column("workspace_forgotten_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("agent_commands", sa.Column("workspace", sa.String(32), nullable=True))
    op.create_table(
        "storage_charges",
        sa.Column("dev_env_id", sa.String(32), nullable=False),
        sa.Column("day", sa.String(10), nullable=False),
        sa.Column("payer_id", sa.String(32), nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("price_per_gib_day", sa.BigInteger, nullable=False),
        sa.Column("gross", sa.BigInteger, nullable=False),
        sa.Column(
            "transaction_id",
            sa.String(32),
            sa.ForeignKey(
                "ledger_transactions.id", ondelete="RESTRICT", name="fk_storage_charges_transaction"
            ),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("dev_env_id", "day", name="pk_storage_charges"),
    )
    op.create_index("ix_storage_charges_payer_day", "storage_charges", ["payer_id", "day"])


def downgrade() -> None:
    op.drop_index("ix_storage_charges_payer_day", "storage_charges")
    op.drop_table("storage_charges")
    op.drop_column("agent_commands", "workspace")
    op.drop_column("dev_envs", "workspace_forgotten_at")
    op.drop_column("dev_envs", "memory_gib")
    op.drop_column("dev_envs", "cpus")
    op.drop_column("jobs", "memory_mib")
    op.drop_column("jobs", "cpus")
