"""``sxwl serve`` and ``sxwl up``: run the cloud (and, for ``up``, the demo around it)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import uvicorn
from rich.console import Console
from rich.table import Table

from sxwl.cloud import logs
from sxwl.cloud.app import create_app
from sxwl.cloud.config import Settings
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db import migrate
from sxwl.cloud.db.models import Role
from sxwl.cloud.services import accounts

DEMO_ACCOUNTS = (
    ("provider@demo.example.com", Role.PROVIDER, "Demo Provider", "Demo GPU Co."),
    ("user@demo.example.com", Role.USER, "Demo User", None),
    ("admin@demo.example.com", Role.ADMIN, "Demo Admin", None),
)


def settings_for(data_dir: Path, port: int | None = None, host: str = "127.0.0.1") -> Settings:
    os.environ.setdefault("SXWL_DATA_DIR", str(data_dir))
    settings = Settings(data_dir=data_dir)
    if port is not None and not settings.public_url:
        shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host  # noqa: S104 - comparing, not binding
        settings = settings.model_copy(update={"public_url": f"http://{shown}:{port}"})
    return settings


def serve(settings: Settings, host: str, port: int) -> None:
    logs.configure(settings.log_level)
    app = create_app(settings)
    uvicorn.run(app, host=host, port=port, log_config=None, timeout_graceful_shutdown=5)


def ensure_demo_accounts(settings: Settings) -> list[tuple[str, Role, str]]:
    """Creates the demo accounts, or resets their passwords: fresh ones are printed on every start,
    so no password is ever written to disk."""
    ctx = CloudContext.from_settings(settings)
    migrate.upgrade(ctx.db.engine)
    logins = []
    with ctx.db.session() as session:
        for email, role, name, company in DEMO_ACCOUNTS:
            password = secrets.token_urlsafe(9)
            user = accounts.find_by_email(session, email)
            if user is None:
                accounts.create_user(ctx, session, accounts.NewAccount(email, password, role, name, company))
            else:
                accounts.set_password(ctx, session, user, password)
            logins.append((email, role, password))
    ctx.db.dispose()
    return logins


def print_banner(url: str, logins: list[tuple[str, Role, str]]) -> None:
    console = Console(stderr=True)
    table = Table(title="Demo logins (passwords are new on every start)", title_justify="left")
    table.add_column("role")
    table.add_column("email")
    table.add_column("password")
    for email, role, password in logins:
        table.add_row(role.value, email, password)
    console.print(f"\n[bold green]算想云 console:[/] [link={url}]{url}[/link]\n")
    console.print(table)
    console.print()
