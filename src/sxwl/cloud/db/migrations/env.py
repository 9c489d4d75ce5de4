from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

# Imported for their tables, which join Base.metadata.
from sxwl.cloud.db import (  # noqa: F401
    devenv_models,
    endpoint_models,
    finetune_models,
    money_models,
    shared_state,
    tunnel_models,
)
from sxwl.cloud.db.models import Base

config = context.config


def _run(connection: object) -> None:
    context.configure(
        connection=connection,  # type: ignore[arg-type]
        target_metadata=Base.metadata,
        render_as_batch=True,  # SQLite cannot ALTER most things in place
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    with create_engine(config.get_main_option("sqlalchemy.url") or "").begin() as conn:
        _run(conn)
