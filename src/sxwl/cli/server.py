"""``sxwl serve`` and ``sxwl up``: run the cloud (and, for ``up``, the demo around it)."""

from __future__ import annotations

import gc
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import uvicorn
from fastapi import FastAPI
from rich.console import Console
from rich.table import Table
from sqlalchemy import select
from sqlalchemy.orm import Session

from sxwl.cli import demo_finetune, demo_money, single_server
from sxwl.cli.supervisor import Supervisor, Worker
from sxwl.cloud.app import create_app
from sxwl.cloud.config import Settings
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db import migrate
from sxwl.cloud.db.models import Job, Role, User
from sxwl.cloud.edge.head_deadline import protocol_with_head_timeout
from sxwl.cloud.kit import logs
from sxwl.cloud.services.accounts import access_keys, accounts
from sxwl.cloud.services.jobs import jobs
from sxwl.protocol.jobs import JobIn
from sxwl.protocol.money import yuan_text

DEMO_USER = "user@demo.example.com"
DEMO_ACCOUNTS = (
    ("provider@demo.example.com", Role.PROVIDER, "Demo Provider", "Demo GPU Co."),
    (DEMO_USER, Role.USER, "Demo User", None),
    ("admin@demo.example.com", Role.ADMIN, "Demo Admin", None),
)


class Server(uvicorn.Server):
    """Tells the cloud it is stopping as soon as the signal arrives, before uvicorn waits for open
    connections: long-polls end at once and liveness stops blaming CPods for the cloud's own exit."""

    def __init__(
        self, config: uvicorn.Config, ctx: CloudContext, on_started: Callable[[], None] | None = None
    ) -> None:
        super().__init__(config)
        self.ctx = ctx
        self.on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.on_started is not None:
            self.on_started()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.ctx.notifier.shutdown()
        super().handle_exit(sig, frame)


def tune_gc() -> None:
    """Collector settings for a long-running server process."""
    # What exists now (modules, the app, the pools) lives as long as the process: full collections
    # need not walk it again.
    gc.freeze()
    # Each request allocates a few hundred objects (a heartbeat's parsed inventory, say): with the
    # default threshold of 700 the young generation is collected every request or two, and survivors
    # are promoted and walked again in the older generations.
    gc.set_threshold(20_000, 20, 20)


def serve(settings: Settings, host: str, port: int, workers: int = 1) -> None:
    """One server process, or ``workers`` of them under a supervisor (cli/supervisor.py)."""
    logs.configure(settings.log_level, settings.log_format)
    with single_server.guard(settings, workers):
        if workers == 1:
            run_worker(settings, host, port)
        else:
            Supervisor(settings, host, port, workers, run_worker).run()


def run_worker(settings: Settings, host: str, port: int, worker: Worker | None = None) -> None:
    """The cloud in this process; ``worker``: as one of a supervisor's worker processes."""
    if worker is not None:
        worker.follow_supervisor()
        logs.configure(settings.log_level, settings.log_format)  # a spawned process starts bare
    app = create_app(settings)
    tune_gc()
    config = uvicorn_config(app, settings, host, port)
    if worker is None:
        Server(config, app.state.ctx).run()
        return
    config.headers = [("x-sxwl-worker", str(worker.index))]
    Server(config, app.state.ctx, on_started=worker.ready.set).run(sockets=worker.sockets)


def uvicorn_config(app: FastAPI, settings: Settings, host: str, port: int) -> uvicorn.Config:
    proxies = settings.trusted_proxy_list()
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        # Our middleware logs each request (cloud/kit/logs.py); uvicorn would still build the arguments
        # of every access-log line, its disabled logger notwithstanding.
        access_log=False,
        timeout_graceful_shutdown=5,
        http=protocol_with_head_timeout(settings.request_head_timeout_s),
        timeout_keep_alive=settings.keep_alive_timeout_s,
        # uvicorn believes X-Forwarded-For from loopback unless told otherwise: anyone on the machine
        # could then pick the address that rate limits and logs see.
        proxy_headers=bool(proxies),
        forwarded_allow_ips=proxies,
    )


@dataclass(frozen=True)
class Demo:
    logins: list[tuple[str, Role, str]]
    provider_access_key: str
    user_balance: int  # micro-yuan
    finetune_missing: str | None = None  # why the fine-tuning demo is not ready, if it is not


def ensure_demo_accounts(settings: Settings) -> Demo:
    """Creates the demo accounts, or resets their passwords: fresh ones are printed on every start,
    so no password is ever written to disk."""
    ctx = CloudContext.from_settings(settings)
    migrate.upgrade(ctx.db.engine)
    logins = []
    made: dict[Role, User] = {}
    with ctx.db.session() as session:
        for email, role, name, company in DEMO_ACCOUNTS:
            password = secrets.token_urlsafe(9)
            user = accounts.find_by_email(session, email)
            if user is None:
                user = accounts.create_user(
                    ctx, session, accounts.NewAccount(email, password, role, name, company)
                )
            else:
                accounts.set_password(ctx, session, user, password)
            made[role] = user
            logins.append((email, role, password))
        key = access_keys.reveal(ctx, session, made[Role.PROVIDER])
        # Priced and funded before the demo job is submitted: a submission needs a balance.
        demo_money.ensure_demo_prices(session, made[Role.ADMIN], demo_money.local_gpu_products())
        balance = demo_money.ensure_demo_credit(session, made[Role.ADMIN], made[Role.USER])
        submit_demo_job(ctx, session, made[Role.USER])
    missing = demo_finetune.ensure_demo_finetune(ctx, made[Role.USER])
    ctx.db.dispose()
    return Demo(logins, key, balance, missing)


EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tiny-lm"
DEMO_JOB = "tiny-lm (demo)"


def submit_demo_job(ctx: CloudContext, session: Session, user: User) -> None:
    """Once per data dir: the example training job, so a new user finds a finished job with logs and
    artifacts. It runs on the local agent with this interpreter (which has numpy)."""
    if not (EXAMPLE / "train.py").exists():
        return  # installed without the checkout's examples
    if session.scalar(select(Job.id).where(Job.owner_id == user.id, Job.name == DEMO_JOB)) is not None:
        return
    spec = JobIn(
        name=DEMO_JOB,
        command='exec "$TINY_LM_PYTHON" "$TINY_LM_DIR/train.py"',
        env={"TINY_LM_DIR": str(EXAMPLE), "TINY_LM_PYTHON": sys.executable, "TINY_LM_STEPS": "200"},
        max_runtime_s=900,
    )
    jobs.submit(ctx, session, user, spec)


def start_local_agent(settings: Settings, access_key: str) -> subprocess.Popen[bytes]:
    """This machine as the demo provider's CPod. The accessKey goes through the environment, never
    the command line (other users can read command lines)."""
    state_dir = settings.data_dir / "agent"
    # The agent's log names jobs and accounts: readable by this user only, like the database.
    log = os.fdopen(
        os.open(settings.data_dir / "agent.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab"
    )
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sxwl.agent",
            "--api-url",
            settings.public_url,
            "--state-dir",
            str(state_dir),
            "--name",
            "local-demo",
            # Where jobs cannot be isolated (not root, no bubblewrap) the demo user's jobs still run.
            "--trust-account",
            DEMO_USER,
            # The demo job's script, readable in its sandbox wherever the checkout is (root's home, /tmp).
            *(["--share-dir", str(EXAMPLE)] if EXAMPLE.is_dir() else []),
        ],
        env={**os.environ, "SXWL_ACCESS_KEY": access_key},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 10) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def print_banner(demo: Demo, url: str) -> None:
    console = Console(stderr=True)
    table = Table(title="Demo logins (passwords are new on every start)", title_justify="left")
    table.add_column("role")
    table.add_column("email")
    table.add_column("password")
    for email, role, password in demo.logins:
        table.add_row(role.value, email, password)
    console.print(f"\n[bold green]算想云 console:[/] [link={url}]{url}[/link]\n")
    console.print(table)
    console.print(
        f"The demo user's balance: [bold]{yuan_text(demo.user_balance)} CNY[/]; this machine runs as the "
        "demo provider's CPod (agent log: [bold]agent.log[/] in the data dir).\n"
    )
    if demo.finetune_missing:
        console.print(f"[yellow]No fine-tuning demo:[/] {demo.finetune_missing}\n")
    else:
        console.print(
            f"Fine-tuning: sign in as the demo user, open 微调 / Fine-tuning and start one on the "
            f"[bold]{demo_finetune.DEMO_MODEL}[/] model with [bold]{demo_finetune.DEMO_DATASET}[/].\n"
        )
