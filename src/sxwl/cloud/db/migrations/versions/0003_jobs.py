"""Jobs, their events, logs, artifacts, and agent commands.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("max_gpus", sa.Integer))
    with op.batch_alter_table("cpods") as batch:
        batch.add_column(sa.Column("reported_jobs", sa.JSON, nullable=False, server_default="[]"))
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("owner_id", sa.String(32), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("command", sa.JSON, nullable=False),
        sa.Column("image", sa.String(500)),
        sa.Column("env", sa.JSON, nullable=False),
        sa.Column("gpu_product", sa.String(128)),
        sa.Column("gpus_per_node", sa.Integer, nullable=False),
        sa.Column("nodes", sa.Integer, nullable=False),
        sa.Column("max_runtime_s", sa.Integer),
        sa.Column("pinned_cpod_id", sa.String(32)),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("cpod_id", sa.String(32), sa.ForeignKey("cpods.id", ondelete="SET NULL")),
        sa.Column("node_names", sa.JSON, nullable=False),
        sa.Column("reason", sa.String(500)),
        sa.Column("exit_code", sa.Integer),
        sa.Column("cancel_requested_at", TS),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("assigned_at", TS),
        sa.Column("started_at", TS),
        sa.Column("finished_at", TS),
    )
    op.create_index("ix_jobs_state_priority", "jobs", ["state", "priority", "created_at"])
    op.create_index("ix_jobs_owner_created", "jobs", ["owner_id", "created_at"])
    op.create_index("ix_jobs_cpod_state", "jobs", ["cpod_id", "state"])
    op.create_table(
        "job_attempts",
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("attempt", sa.Integer, primary_key=True),
        sa.Column("cpod_id", sa.String(32), sa.ForeignKey("cpods.id", ondelete="SET NULL")),
        sa.Column("node_names", sa.JSON, nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("assigned_at", TS, nullable=False),
        sa.Column("started_at", TS),
        sa.Column("finished_at", TS),
        sa.Column("outcome", sa.String(16)),
    )
    op.create_index("ix_job_attempts_cpod_id", "job_attempts", ["cpod_id"])
    op.create_table(
        "job_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("detail", sa.String(1000)),
    )
    op.create_index("ix_job_events_job_id", "job_events", ["job_id"])
    op.create_table(
        "log_chunks",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("offset", sa.BigInteger, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.UniqueConstraint("job_id", "attempt", "offset", name="uq_log_chunks_position"),
    )
    op.create_table(
        "artifacts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("path", sa.String(1024), nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("job_id", "path", name="uq_artifacts_job_path"),
    )
    op.create_index("ix_artifacts_job_id", "artifacts", ["job_id"])
    op.create_table(
        "agent_commands",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("cpod_id", sa.String(32), sa.ForeignKey("cpods.id", ondelete="CASCADE"), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("reason", sa.String(200)),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("acked_at", TS),
    )
    op.create_index("ix_agent_commands_pending", "agent_commands", ["cpod_id", "acked_at"])


def downgrade() -> None:
    for table in ("agent_commands", "artifacts", "log_chunks", "job_events", "job_attempts", "jobs"):
        op.drop_table(table)
    with op.batch_alter_table("cpods") as batch:
        batch.drop_column("reported_jobs")
    with op.batch_alter_table("users") as batch:
        batch.drop_column("max_gpus")
