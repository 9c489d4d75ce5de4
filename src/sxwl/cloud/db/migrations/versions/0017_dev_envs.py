"""Dev environments (docs/dev-envs.md): ``dev_envs``, one row per environment, which outlives its
jobs (a paused environment has none running; resuming it submits another), and ``jobs.dev_env_id``,
which marks a job as an environment's, so its workload kind knows it from the job's row alone;
``ssh_keys``, the public keys a user's environments accept.

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "dev_envs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("owner_id", sa.String(32), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("gpu_product", sa.String(128), nullable=True),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("image", sa.String(500), nullable=True),
        sa.Column("mounts", sa.JSON(), nullable=False),
        sa.Column("inputs", sa.JSON(), nullable=False),
        sa.Column("idle_timeout_min", sa.Integer, nullable=False),
        sa.Column("job_id", sa.String(32), nullable=True),
        sa.Column("cpod_id", sa.String(32), nullable=True),
        sa.Column("reason", sa.String(1000), nullable=True),
        sa.Column("active_at", _WHEN, nullable=True),
        sa.Column("jupyter_activity", sa.String(64), nullable=True),
        sa.Column("saved", sa.JSON(), nullable=True),
        sa.Column("created_at", _WHEN, nullable=False),
        sa.Column("stopped_at", _WHEN, nullable=True),
    )
    op.create_index("ix_dev_envs_owner_created", "dev_envs", ["owner_id", "created_at"])
    # One live environment of a name per user: the losing request of two gets a 409.
    op.create_index(
        "uq_dev_envs_owner_name_live",
        "dev_envs",
        ["owner_id", "name"],
        unique=True,
        sqlite_where=sa.text("state != 'stopped'"),
        postgresql_where=sa.text("state != 'stopped'"),
    )
    # The public keys a user's environments' sshd accepts (docs/dev-envs.md, "SSH").
    op.create_table(
        "ssh_keys",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("owner_id", sa.String(32), sa.ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("public_key", sa.String(20000), nullable=False),
        sa.Column("fingerprint", sa.String(100), nullable=False),
        sa.Column("created_at", _WHEN, nullable=False),
    )
    op.create_index("ix_ssh_keys_owner_id", "ssh_keys", ["owner_id"])
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("dev_env_id", sa.String(32), nullable=True))


def downgrade() -> None:
    # Plain ALTER TABLE … DROP COLUMN (SQLite 3.35+): a batch would recreate "jobs", which other
    # tables reference.
    op.drop_column("jobs", "dev_env_id")
    op.drop_table("ssh_keys")
    op.drop_table("dev_envs")
