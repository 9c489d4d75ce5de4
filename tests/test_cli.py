"""The `sxwl` command against a real cloud process: serve, up, login, whoami, access-key, logout."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sxwl.cli import demo_money, server
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.money_models import PriceResource
from sxwl.cloud.services.accounts import accounts
from sxwl.cloud.services.money import ledger, prices
from sxwl.protocol.money import MICRO
from tests.support.agent import eventually
from tests.support.cloud import CloudProcess
from tests.support.cloud import test_settings as settings_for_test  # not collected as a test
from tests.support.net import free_port


def sxwl(*args: str, env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sxwl.cli", *args],
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def cloud(tmp_path: Path, db_url: str) -> Iterator[CloudProcess]:
    process = CloudProcess(tmp_path / "data", free_port(), env={"SXWL_DATABASE_URL": db_url})
    yield process
    process.stop()


def test_cli_session_against_a_served_cloud(cloud: CloudProcess, tmp_path: Path) -> None:
    env = {**os.environ, "SXWL_CONFIG_DIR": str(tmp_path / "cfg")}
    created = httpx.post(
        cloud.url + "/api/v1/auth/register",
        json={"email": "owner@example.com", "password": "correct horse", "role": "provider"},
    )
    assert created.status_code == 201

    bad = sxwl(
        "login",
        "--url",
        cloud.url,
        "--email",
        "owner@example.com",
        "--password-stdin",
        env=env,
        stdin="wrong password\n",
    )
    assert bad.returncode == 1 and "email or password is incorrect" in bad.stderr

    ok = sxwl(
        "login",
        "--url",
        cloud.url,
        "--email",
        "owner@example.com",
        "--password-stdin",
        env=env,
        stdin="correct horse\n",
    )
    assert ok.returncode == 0, ok.stderr
    creds = tmp_path / "cfg" / "credentials.json"
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600

    who = sxwl("whoami", env=env)
    assert "owner@example.com" in who.stdout and "role=provider" in who.stdout

    key = sxwl("access-key", "show", env=env).stdout.strip()
    assert key.startswith("sxak_")
    rotated = sxwl("access-key", "rotate", "--yes", env=env).stdout.strip()
    assert rotated.startswith("sxak_") and rotated != key
    assert sxwl("access-key", "show", env=env).stdout.strip() == rotated

    out = sxwl("logout", env=env)
    assert out.returncode == 0 and not creds.exists()
    again = sxwl("whoami", env=env)
    assert again.returncode == 1 and "sxwl login" in again.stderr
    # The secret never reaches the log of the server.
    assert "correct horse" not in cloud.log_path.read_text()
    assert rotated not in cloud.log_path.read_text()


def test_up_creates_demo_accounts_and_prints_their_logins(tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "SXWL_ARGON2_TIME_COST": "1",
        "SXWL_ARGON2_MEMORY_KIB": "1024",
        "SXWL_METERING_INTERVAL_S": "1",
        "COLUMNS": "200",
    }
    log = (tmp_path / "up.log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sxwl.cli", "up", "--port", str(port), "--data-dir", str(tmp_path / "data")],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        CloudProcess.wait_for(url, proc, Path(log.name), timeout=CloudProcess.UP_READY_S)
        text = Path(log.name).read_text()
        assert url in text
        logins = dict(re.findall(r"│ \w+\s+│ (\S+@demo\.example\.com)\s+│ (\S+)\s+│", text))
        assert set(logins) == {"provider@demo.example.com", "user@demo.example.com", "admin@demo.example.com"}
        tokens = {}
        for email, password in logins.items():
            response = httpx.post(url + "/api/v1/auth/login", json={"email": email, "password": password})
            assert response.status_code == 200, email
            tokens[email] = {"Authorization": f"Bearer {response.json()['access_token']}"}
        # The secret key was generated into the data dir, readable by the owner only.
        assert stat.S_IMODE((tmp_path / "data" / "secret.key").stat().st_mode) == 0o600

        # This machine is the demo provider's CPod.
        def online() -> list[dict[str, object]]:
            cpods = httpx.get(url + "/api/v1/cpods", headers=tokens["provider@demo.example.com"]).json()
            return [c for c in cpods if c["status"] == "online"]

        (cpod,) = eventually(online, what="the local CPod online")
        assert cpod["name"] == "local-demo"
        assert cpod["nodes"][0]["cpu_cores"] == os.cpu_count()  # type: ignore[index]
        assert agent_pids(tmp_path)

        # The demo user finds the example training job, run on this machine, with its results.
        user = tokens["user@demo.example.com"]

        def demo_job_done() -> dict[str, object] | None:
            (job,) = httpx.get(url + "/api/v1/jobs", headers=user).json()["items"]
            return job if job["state"] in ("succeeded", "failed") else None

        job = eventually(demo_job_done, timeout=180, what="the demo job to finish")
        assert job["name"] == "tiny-lm (demo)" and job["state"] == "succeeded"
        artifacts = httpx.get(f"{url}/api/v1/jobs/{job['id']}/artifacts", headers=user).json()
        assert {a["path"] for a in artifacts} == {"checkpoint.npz", "metrics.json"}
        assert "step 200 loss" in httpx.get(f"{url}/api/v1/jobs/{job['id']}/logs", headers=user).text

        # Money: the demo user was funded, the demo job is billed, and the demo provider earns for it.
        assert "The demo user's balance: 100.00 CNY" in text
        cost = eventually(
            lambda: httpx.get(f"{url}/api/v1/jobs/{job['id']}", headers=user).json()["cost"] or None,
            what="the demo job's cost",
        )
        assert cost > 0
        # The job page shows its cost at once; the balance moves when the metering loop rates it.
        eventually(
            lambda: (
                httpx.get(f"{url}/api/v1/billing/balance", headers=user).json()["balance"]
                == 100_000_000 - cost
            ),
            timeout=90,
            what="the demo job's cost charged to the balance",
        )
        provider = tokens["provider@demo.example.com"]
        earned = httpx.get(f"{url}/api/v1/earnings", headers=provider).json()
        assert earned["pending"] > 0 and earned["available"] == 0  # held for the default 7 days

        # Fine-tuning: the tiny model and the sample dataset are there, and a fine-tune of them finishes.
        assert "start one on the tiny-llama model" in " ".join(text.split())
        assert "tiny-llama" in [m["id"] for m in httpx.get(f"{url}/v1/models", headers=user).json()["data"]]
        (sample,) = httpx.get(f"{url}/v1/files", headers=user).json()["data"]
        assert sample["status"] == "processed" and sample["validation"]["examples"] == 40
        body = {"model": "tiny-llama", "training_file": sample["id"], "hyperparameters": {"n_epochs": 1}}
        created = httpx.post(f"{url}/v1/fine_tuning/jobs", headers=user, json=body, timeout=30)
        assert created.status_code == 200, created.text

        def fine_tuned() -> dict[str, Any] | None:
            ft: dict[str, Any] = httpx.get(
                f"{url}/v1/fine_tuning/jobs/{created.json()['id']}", headers=user
            ).json()
            return ft if ft["status"] in ("succeeded", "failed", "cancelled") else None

        ft = eventually(fine_tuned, timeout=240, what="the demo fine-tune to finish")
        assert ft["status"] == "succeeded" and ft["fine_tuned_model"].startswith("ft:tiny-llama:")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
        log.close()
    # Stopping `sxwl up` stops its agent too.
    eventually(lambda: not agent_pids(tmp_path), what="the agent to stop with sxwl up")


def test_demo_money_is_set_once_and_never_over_an_admins_change(tmp_path: Path) -> None:
    settings = settings_for_test(tmp_path / "data", f"sqlite:///{tmp_path / 'sxwl.db'}", billing_enabled=True)
    server.ensure_demo_accounts(settings)
    ctx = CloudContext.from_settings(settings)
    with ctx.db.session() as session:
        admin = accounts.find_by_email(session, "admin@demo.example.com")
        assert admin is not None
        # An admin changes the CPU price and removes a demo GPU price.
        prices.set_price(
            session, admin, resource=PriceResource.CPU, product="", rate=prices.Rate(3 * MICRO, 500)
        )
        demo_money.ensure_demo_prices(session, admin, ["DEMO-GPU"])
        prices.set_price(session, admin, resource=PriceResource.GPU, product="DEMO-GPU", rate=None)
    again = server.ensure_demo_accounts(settings)  # a restart of `sxwl up`
    with ctx.db.session() as session:
        admin = accounts.find_by_email(session, "admin@demo.example.com")
        assert admin is not None
        demo_money.ensure_demo_prices(session, admin, ["DEMO-GPU"])
        book = prices.price_book(session)
        user = accounts.find_by_email(session, "user@demo.example.com")
        assert user is not None
        assert ledger.balance(session, ledger.account_key(ledger.USER_CASH, user.id)) == 100 * MICRO
    ctx.db.dispose()
    assert again.user_balance == 100 * MICRO  # topped up once, not once per start
    assert book.cpu == prices.Rate(3 * MICRO, 500) and book.gpu == {}


def agent_pids(marker: Path) -> list[int]:
    """Processes running sxwl.agent with a state dir under ``marker`` (read from /proc, to assert on)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().split()[2]
        except OSError:
            continue
        if (
            b"sxwl.agent" in cmdline
            and any(str(marker).encode() in part for part in cmdline)
            and state != "Z"
        ):
            pids.append(int(entry.name))
    return pids


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--gpus", "65"], "--gpus"),
        (["--nodes", "0"], "--nodes"),
        (["--max-runtime", "0"], "--max-runtime"),
        (["--env", "SXWL_JOB_ID=x"], "--env SXWL_JOB_ID"),
        (["--env", "1BAD=x"], "--env 1BAD"),
    ],
)
def test_job_flags_out_of_bounds_are_refused_before_anything_is_sent(
    tmp_path: Path, flags: list[str], named: str
) -> None:
    # No credentials and no cloud: the flag is judged by the job's own limits, not by a server.
    env = {**os.environ, "SXWL_CONFIG_DIR": str(tmp_path / "cfg"), "COLUMNS": "200"}
    result = sxwl("jobs", "submit", *flags, "--", "true", env=env)
    assert result.returncode == 2
    assert named in result.stderr and "sxwl login" not in result.stderr
