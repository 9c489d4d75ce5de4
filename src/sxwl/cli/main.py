"""Entry point of the ``sxwl`` command."""

from __future__ import annotations

import getpass
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from sxwl.cli import admin_models, admin_money, billing, client, dev, dev_ssh, endpoints, finetune, jobs
from sxwl.cli.client import CliError, Credentials
from sxwl.cli.cloud_settings import settings_for
from sxwl.cli.output import err, listing, out, show
from sxwl.cloud.kit.logs import LogFormat

app = typer.Typer(
    help="算想云 (sxwl): the cloud server and its command-line client.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
admin_app = typer.Typer(help="Administration on the server's own database.", no_args_is_help=True)
key_app = typer.Typer(help="A compute provider's accessKey.", no_args_is_help=True)
cpods_app = typer.Typer(help="CPods: the GPU clusters providers register.", no_args_is_help=True)
app.add_typer(cpods_app, name="cpods")
app.add_typer(jobs.app, name="jobs")
app.add_typer(dev.app, name="dev")
app.add_typer(dev_ssh.keys_app, name="ssh-keys")
app.command("ssh", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(dev_ssh.ssh)
app.add_typer(finetune.app, name="finetune")
app.add_typer(endpoints.app, name="endpoints")
app.add_typer(endpoints.keys_app, name="keys")
app.add_typer(finetune.files_app, name="files")
app.add_typer(finetune.models_app, name="models")
app.add_typer(admin_app, name="admin")
app.add_typer(key_app, name="access-key")
app.add_typer(billing.app, name="billing")
app.command("earnings")(billing.earnings)
admin_money.register(admin_app)
admin_models.register(admin_app)

DataDir = Annotated[
    Path, typer.Option("--data-dir", envvar="SXWL_DATA_DIR", help="Where the database and keys live.")
]
Port = Annotated[int, typer.Option("--port", help="Port to listen on.")]
LogFormatOption = Annotated[
    LogFormat | None,
    typer.Option(
        "--log-format",
        help="Server log lines: text (short, for a terminal), json (for files and collectors), or auto: "
        "text when standard error is a terminal. Default: SXWL_LOG_FORMAT, else auto.",
        show_default=False,
    ),
]
PasswordStdin = Annotated[
    bool, typer.Option("--password-stdin", help="Read the password from standard input.")
]


def read_password(from_stdin: bool, confirm: bool = False) -> str:
    if from_stdin:
        return sys.stdin.readline().rstrip("\n")
    password = getpass.getpass("Password: ")
    if confirm and getpass.getpass("Repeat password: ") != password:
        raise CliError("the passwords differ", exit_code=2)
    return password


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Port = 8000,
    data_dir: DataDir = Path(".sxwl"),
    log_format: LogFormatOption = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            min=1,
            help="Worker processes on this machine, each a full replica on the one port (PostgreSQL "
            "only; docs/operations.md). Default: SXWL_WORKERS, else 1.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run the cloud server (applies database migrations first)."""
    from sxwl.cli import server  # the web application: only the commands that serve it import it

    settings = settings_for(data_dir, port, host, log_format)
    server.serve(settings, host, port, workers or settings.workers)


@app.command()
def up(port: Port = 8000, data_dir: DataDir = Path(".sxwl"), log_format: LogFormatOption = None) -> None:
    """Run the cloud with demo accounts (a provider, a user, an admin) and this machine as the demo
    provider's CPod; print the console URL and the logins."""
    from sxwl.cli import server

    settings = settings_for(data_dir, port, log_format=log_format)
    demo = server.ensure_demo_accounts(settings)
    server.print_banner(demo, settings.public_url)
    agent = server.start_local_agent(settings, demo.provider_access_key)
    # uvicorn re-raises SIGTERM after its shutdown; turning it into SystemExit lets `finally` stop the agent.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve(settings, "127.0.0.1", port)
    finally:
        server.stop_process(agent)


@cpods_app.command("list")
def list_cpods() -> None:
    """Your CPods (every CPod, with its owner, for an admin)."""
    rows = client.call("GET", "/api/v1/cpods").json()
    if not rows:
        out.print(
            "No CPod has registered yet. Deploy one with `3kctl deploy all --access-key=…` "
            "(see `sxwl access-key show`)."
        )
        return
    table = listing("id", "name", "status", "owner", "nodes", "GPUs (allocatable/total)", "last heartbeat")
    for cpod in rows:
        gpus = (
            ", ".join(f"{g['product']} {g['allocatable']}/{g['total']}" for g in cpod["gpu_summary"]) or "-"
        )
        status = "revoked" if cpod["revoked"] else cpod["status"]
        table.add_row(
            cpod["id"],  # whole: `sxwl jobs submit --cpod` takes nothing less
            escape(cpod["name"]),
            status,
            cpod["owner_email"],
            str(len(cpod["nodes"])),
            gpus,
            cpod["last_heartbeat_at"] or "never",
        )
    show(table)


@app.command("gpu-types")
def gpu_types() -> None:
    """Free GPUs per product over all online CPods, and their price per GPU-hour."""
    rows = client.call("GET", "/api/v1/gpu-types").json()
    if not rows:
        out.print("No GPUs are online right now.")
        return
    table = listing("product", "memory (GiB)", "available", "total", "price per GPU-hour", ids=("product",))
    for row in rows:
        table.add_row(
            row["product"],
            f"{row['memory_mib'] / 1024:.0f}",
            str(row["available"]),
            str(row["total"]),
            billing.price_text(row.get("price_per_hour")),
        )
    show(table)


@admin_app.command("create-user")
def create_user(
    email: Annotated[str, typer.Option(help="Email address to sign in with.")],
    role: Annotated[str, typer.Option(help="admin, provider or user.")] = "admin",
    name: Annotated[str | None, typer.Option(help="Display name.")] = None,
    password_stdin: PasswordStdin = False,
    data_dir: DataDir = Path(".sxwl"),
) -> None:
    """Create an account directly in the database (how the first admin is made)."""
    from sxwl.cloud.context import CloudContext
    from sxwl.cloud.db import migrate
    from sxwl.cloud.db.models import Role
    from sxwl.cloud.errors import AppError
    from sxwl.cloud.services.accounts import accounts

    if role not in {r.value for r in Role}:
        raise CliError(f"--role: expected admin, provider or user, got {role!r}", exit_code=2)
    try:
        normalized = accounts.normalize_email(email)
    except ValueError as exc:
        raise CliError(f"--email: {exc}", exit_code=2) from None
    password = read_password(password_stdin, confirm=True)
    settings = settings_for(data_dir)
    ctx = CloudContext.from_settings(settings)
    migrate.upgrade(ctx.db.engine)
    try:
        with ctx.db.session() as session:
            user = accounts.create_user(
                ctx, session, accounts.NewAccount(normalized, password, Role(role), name)
            )
    except AppError as exc:
        raise CliError(exc.message, exit_code=2 if exc.status == 422 else 1) from None
    finally:
        ctx.db.dispose()
    out.print(f"created {user.role.value} {user.email} (id {user.id})")


@admin_app.command("set-gpu-limit")
def set_gpu_limit(
    email: Annotated[str, typer.Option(help="The user's email.")],
    max_gpus: Annotated[
        int | None, typer.Option(help="Concurrent GPUs; omit to use the cloud's default.", min=0)
    ] = None,
    data_dir: DataDir = Path(".sxwl"),
) -> None:
    """Cap the GPUs one user's jobs may hold at once (also PATCH /api/v1/admin/users/{id}/limits)."""
    from sxwl.cloud.context import CloudContext
    from sxwl.cloud.db import migrate
    from sxwl.cloud.services.accounts import accounts

    ctx = CloudContext.from_settings(settings_for(data_dir))
    migrate.upgrade(ctx.db.engine)
    try:
        with ctx.db.session() as session:
            user = accounts.find_by_email(session, email.strip().lower())
            if user is None:
                raise CliError(f"--email: no account {email}", exit_code=2)
            accounts.set_max_gpus(session, user.id, max_gpus)
    finally:
        ctx.db.dispose()
    limit = f"at most {max_gpus}" if max_gpus is not None else "the cloud's default number of"
    out.print(f"{email}: {limit} GPUs at once")


@app.command()
def login(
    url: Annotated[str, typer.Option(help="The cloud's URL, e.g. http://127.0.0.1:8000.")],
    email: Annotated[str, typer.Option(help="Your account's email.")],
    password_stdin: PasswordStdin = False,
) -> None:
    """Sign in and keep the token in your config dir (mode 0600)."""
    password = read_password(password_stdin)
    response = client.request(
        "POST", url.rstrip("/") + "/api/v1/auth/login", json={"email": email, "password": password}
    )
    path = Credentials(url=url.rstrip("/"), token=response.json()["access_token"], email=email).save()
    out.print(f"signed in as {email}; token saved to {path}")


@app.command()
def logout() -> None:
    """Revoke the saved token and forget it."""
    creds = Credentials.load()
    try:
        client.call("POST", "/api/v1/auth/logout")
    finally:
        client.credentials_path().unlink(missing_ok=True)
    out.print(f"signed out {creds.email}")


@app.command()
def whoami() -> None:
    """Show the signed-in account."""
    me = client.call("GET", "/api/v1/me").json()
    out.print(f"{me['email']}  role={me['role']}  name={me.get('name') or '-'}  id={me['id']}")


@key_app.command("show")
def show_key() -> None:
    """Print your accessKey (providers only)."""
    out.print(client.call("GET", "/api/v1/me/access-key").json()["access_key"], soft_wrap=True)


@key_app.command("rotate")
def rotate_key(
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Issue a new accessKey; the old one stops working at once."""
    if not yes and not typer.confirm("The old accessKey stops working at once. Rotate?"):
        raise typer.Exit(1)
    out.print(client.call("POST", "/api/v1/me/access-key/rotate").json()["access_key"], soft_wrap=True)


def main() -> None:
    try:
        app()
    except CliError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        sys.exit(exc.exit_code)
