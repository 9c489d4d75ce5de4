"""`sxwl` for money against a served cloud with billing on: an admin's prices, top-ups, payouts and
ledger check on the server's database; a user's balance and statement and a provider's earnings over
the API; bad input refused naming its flag, with nothing changed."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

from sxwl.cloud.services.money import ledger
from sxwl.protocol.money import money_text
from tests.support.agent import eventually
from tests.test_cli import sxwl
from tests.test_jobs_process import PRODUCT, World

ADMIN = "admin@example.com"
USER = "dev@example.com"
PROVIDER = "owner@example.com"


class Cli:
    """The CLI with one config dir (one signed-in account at a time) and the cloud's data dir."""

    def __init__(self, world: World, tmp_path: Path, db_url: str) -> None:
        self.world = world
        self.data_dir = str(world.root / "cloud")
        self.env = {
            **os.environ,
            "SXWL_CONFIG_DIR": str(tmp_path / "cfg"),
            "SXWL_DATABASE_URL": db_url,
            "SXWL_ARGON2_TIME_COST": "1",
            "SXWL_ARGON2_MEMORY_KIB": "1024",
            "COLUMNS": "200",
        }
        self.env.pop("SXWL_ADMIN_EMAIL", None)

    def admin(self, *args: str, actor: str | None = ADMIN) -> tuple[int, str]:
        flags = ["--as", actor] if actor else []
        result = sxwl("admin", *args, *flags, "--data-dir", self.data_dir, env=self.env)
        return result.returncode, result.stdout + result.stderr

    def read(self, *args: str) -> tuple[int, str]:
        """A command that changes nothing (no --as)."""
        return self.admin(*args, actor=None)

    def login(self, email: str) -> None:
        result = sxwl(
            "login", "--url", self.world.url, "--email", email, "--password-stdin",
            env=self.env, stdin="correct horse\n",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr

    def user(self, *args: str) -> tuple[int, str]:
        result = sxwl(*args, env=self.env)
        return result.returncode, result.stdout + result.stderr


@pytest.fixture
def cli(tmp_path: Path, db_url: str) -> Iterator[Cli]:
    world = World(
        tmp_path,
        db_url,
        SXWL_BILLING_ENABLED="true",
        SXWL_METERING_INTERVAL_S="0.3",
        SXWL_EARNINGS_HOLD_S="0",
    )
    tool = Cli(world, tmp_path, db_url)
    made = sxwl(
        "admin", "create-user", "--email", ADMIN, "--password-stdin", "--data-dir", tool.data_dir,
        env=tool.env, stdin="correct horse\ncorrect horse\n",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    yield tool
    world.close()


def balance(cli: Cli) -> str:
    body = httpx.get(f"{cli.world.url}/api/v1/billing/balance", headers=cli.world.user).json()
    return str(body["balance_yuan"])


# The flags are checked before any database work: one engine is enough (each call is a process).
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_bad_input_is_refused_naming_the_flag_and_changes_nothing(cli: Cli) -> None:
    assert cli.admin("prices", "set", "--product", PRODUCT, "--price", "7.20", "--fee", "10")[0] == 0
    assert cli.admin("top-up", "--email", USER, "--amount", "100", "--note", "first")[0] == 0
    before_prices = cli.read("prices")[1]
    refused = [
        (("top-up", "--email", USER, "--amount", "-5"), "--amount"),
        (("top-up", "--email", USER, "--amount", "0"), "--amount"),
        (("top-up", "--email", USER, "--amount", "lots"), "--amount"),
        (("top-up", "--email", "nobody@example.com", "--amount", "5"), "--email: no account"),
        (("top-up", "--email", PROVIDER, "--amount", "5"), "--email/--user-id: providers do not run jobs"),
        (("top-up", "--user-id", "nope", "--amount", "5"), "--email/--user-id: no user"),
        (("top-up", "--amount", "5"), "--email or --user-id"),
        (("top-up", "--email", USER, "--amount", "5", "--note", "x" * 501), "--note: at most 500"),
        (("payout", "--email", PROVIDER, "--amount", "1", "--reference", " "), "--reference: must not"),
        (("prices", "set", "--product", PRODUCT, "--price", "1", "--fee", "150"), "--fee"),
        (("prices", "set", "--product", PRODUCT, "--price", "-1", "--fee", "10"), "--price"),
        (("prices", "set", "--price", "1", "--fee", "10"), "--product, --cpu or --storage"),
        (("prices", "set", "--cpu", "--storage", "--price", "1"), "--product, --cpu or --storage"),
        (("prices", "set", "--cpu", "--price", "1"), "--fee: give the platform's fee"),
        (("payout", "--email", PROVIDER, "--amount", "1", "--reference", "r"), "--amount: is more than"),
        (("payout", "--email", USER, "--amount", "1", "--reference", "r"), "--email: no provider"),
    ]
    for args, named in refused:
        code, output = cli.admin(*args)
        assert code == 2 and named in output, (args, output)
    # Money changes only under an admin's name.
    for actor, named in (
        (None, "--as: name the admin"),
        (USER, "is not an admin"),
        ("x@example.com", "no account"),
    ):
        code, output = cli.admin("top-up", "--email", USER, "--amount", "5", actor=actor)
        assert code == 2 and named in output, output
    code, output = cli.admin("prices", "remove", "--product", "NVIDIA-H100")
    assert code == 1 and "no price is set for NVIDIA-H100" in output
    assert balance(cli) == "100"
    assert cli.read("prices")[1] == before_prices

    cli.login(USER)
    assert cli.user("billing", "statement", "--month", "2026-13")[0] == 2
    code, output = cli.user("earnings")
    assert code == 1 and "provider" in output


def test_ledger_check_fails_on_a_corrupted_cached_balance(cli: Cli, db_url: str) -> None:
    assert cli.admin("top-up", "--email", USER, "--amount", "12.5")[0] == 0
    code, output = cli.read("ledger", "check")
    assert code == 0 and "1 transactions, 2 entries" in output and "ok" in output
    me = httpx.get(f"{cli.world.url}/api/v1/me", headers=cli.world.user).json()
    engine = create_engine(db_url)
    with engine.begin() as db:
        db.execute(
            text("UPDATE ledger_accounts SET balance = balance + 1 WHERE key = :key"),
            {"key": ledger.account_key(ledger.USER_CASH, me["id"])},
        )
    engine.dispose()
    code, output = cli.read("ledger", "check")
    assert code == 1
    assert f"user_cash:{me['id']}: cached 12500001, entries sum to 12500000" in output
    assert "does not balance" in output


def test_money_from_prices_to_payout(cli: Cli) -> None:
    world = cli.world
    code, output = cli.admin("prices", "set", "--product", PRODUCT, "--price", "7.20", "--fee", "10")
    assert code == 0 and "7.20 CNY per GPU-hour" in output
    cli.env["SXWL_ADMIN_EMAIL"] = ADMIN  # the environment names the admin as well as --as
    assert cli.admin("prices", "set", "--cpu", "--price", "0.5", "--fee", "10", actor=None)[0] == 0
    code, output = cli.admin("prices", "set", "--storage", "--price", "0.02", actor=None)
    assert code == 0 and "0.02 CNY per GiB-day of saved workspace, fee 100" in output, output
    listed = cli.read("prices")[1]
    assert PRODUCT in listed and "7.20 / GPU-hour" in listed and "0.50 / core-hour" in listed
    assert "0.02 / GiB-day" in listed and "saved workspaces" in listed
    assert ADMIN in listed  # who set them (and when)
    code, output = cli.admin("top-up", "--email", USER, "--amount", "100", "--idempotency-key", "k1")
    assert code == 0 and "balance now 100.00 CNY" in output
    code, output = cli.admin("top-up", "--email", USER, "--amount", "100", "--idempotency-key", "k1")
    assert code == 0 and "balance now 100.00 CNY" in output  # the same key adds nothing again

    world.agent()
    world.online()
    cli.login(USER)
    code, output = cli.user("gpu-types")
    assert code == 0 and "price per GPU-hour" in output and "7.20 CNY" in output
    job_id = world.submit("sleep 3", gpus=2)
    world.wait_state(job_id, "succeeded")
    eventually(lambda: world.job(job_id)["cost"] > 0, what="the job metered")
    code, output = cli.user("jobs", "show", job_id)
    charged = money_text(world.job(job_id)["cost"])
    assert code == 0 and re.search(rf"cost +{re.escape(charged)} CNY", output), output
    code, output = cli.user("billing", "balance")
    assert code == 0 and "balance: " in output and "CNY" in output
    code, output = cli.user("billing", "statement")
    assert code == 0 and PRODUCT in output and "top-up" in output and "total charged" in output
    target = Path(cli.env["SXWL_CONFIG_DIR"]).parent / "statement.csv"
    assert cli.user("billing", "statement", "--csv", str(target))[0] == 0
    assert target.read_text().splitlines()[0].startswith("job,job_name,attempt,gpu_product,gpu_seconds")

    # The hold is 0 here: the provider's earnings become available, and an admin pays some out.
    cli.login(PROVIDER)
    provider = world.provider

    def available() -> int | None:
        body = httpx.get(f"{world.url}/api/v1/earnings", headers=provider).json()
        released = body["pending"] == 0 and body["available"] == body["month_net"] > 0
        return int(body["available"]) if released else None

    paid = eventually(available, what="earnings available")
    code, output = cli.user("earnings")
    assert code == 0 and "available" in output and "GPU-hours sold" in output and PRODUCT in output
    amount = f"{paid / 1_000_000:.6f}"
    code, output = cli.admin("payout", "--email", PROVIDER, "--amount", amount, "--reference", "bank 42")
    assert code == 0 and "0.00 CNY still available" in output, output
    code, output = cli.read("ledger", "check")
    assert code == 0 and "ok" in output


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_followed_logs_end_with_the_state_and_a_statement_reads_what_was_paid(cli: Cli) -> None:
    world = cli.world
    # A price low enough that a few seconds cost less than a fen.
    assert cli.admin("prices", "set", "--product", PRODUCT, "--price", "0.01", "--fee", "10")[0] == 0
    assert cli.admin("top-up", "--email", USER, "--amount", "1")[0] == 0
    world.agent()
    world.online()
    cli.login(USER)

    # `jobs logs -f` prints the log, then the job's final state; a failed job fails the command.
    failed = world.submit("echo started; sleep 2; exit 7")
    done = sxwl("jobs", "logs", failed[:12], "-f", env=cli.env)
    assert done.returncode == 3 and "started" in done.stdout, done
    assert f"job {failed} failed (exit 7)" in done.stderr and "started" not in done.stderr, done.stderr
    fine = world.submit("echo fine; sleep 1")
    done = sxwl("jobs", "logs", fine[:12], "-f", env=cli.env)
    assert done.returncode == 0 and "fine" in done.stdout and f"job {fine} succeeded" in done.stderr, done

    def metered() -> dict[str, Any] | None:
        body: dict[str, Any] = httpx.get(f"{world.url}/api/v1/billing/statement", headers=world.user).json()
        costs = {job: world.job(job)["cost"] for job in (failed, fine)}
        lines = {line["job_id"]: line["gross"] for line in body["lines"]}
        return body if lines == costs and all(costs.values()) else None

    statement = eventually(metered, what="both jobs charged in the statement")
    code, output = cli.user("billing", "statement")
    assert code == 0, output
    for line in statement["lines"]:
        assert 0 < line["gross"] < 10_000, line  # the premise: below a fen
        row = next(r for r in output.splitlines() if line["job_id"][:12] in r)
        assert money_text(line["gross"]) in row and "0.00 " not in row, row
        if line.get("cpod_id"):
            assert line["cpod_id"] not in output
    assert f"total charged: {money_text(statement['total'])} CNY" in output, output
    # A user's statement reads what the user paid: not the provider's fee and net.
    assert not re.search(r"\b(fee|net)\b", output), output
