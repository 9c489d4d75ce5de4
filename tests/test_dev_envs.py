"""Dev environments end to end (docs/dev-envs.md): `sxwl serve` and a real `sxwl-agent` on loopback,
the agent running a real JupyterLab in its sandbox on a Unix socket, reached only through the
agent's tunnel and the cloud's /dev/<env>/ with the owner's console session: the Jupyter API, XSRF,
a kernel's WebSocket executing code, refusals of everyone else, and the money in the ledger."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets.sync.client as ws_client
from websockets.exceptions import InvalidStatus

from tests.support.agent import AgentProcess, eventually, simulated_agent
from tests.support.browser import PASSWORD, api_token, create_admin
from tests.support.cloud import CloudProcess
from tests.support.net import free_port
from tests.support.tiny_finetune import build_model, register_public_model

pytest.importorskip("jupyterlab", reason="JupyterLab comes with the devenv extra")

PRODUCT = "SIM-DEV-GPU"
MODEL = "tiny-llama"
CLOUD_ENV = {
    "SXWL_HEARTBEAT_INTERVAL_MIN_S": "0.1",
    "SXWL_SCHEDULER_INTERVAL_S": "0.2",
    "SXWL_METERING_INTERVAL_S": "0.5",
    "SXWL_BILLING_ENABLED": "true",
    "SXWL_DEV_ENV_IDLE_CHECK_S": "1",
}


class World:
    """A cloud, a provider's agent with one simulated GPU, an admin who priced it, a topped-up user."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self.db_url = db_url = f"sqlite:///{root / 'sxwl.db'}"
        self.cloud = CloudProcess(root / "cloud", free_port(), env={"SXWL_DATABASE_URL": db_url, **CLOUD_ENV})
        self.url = self.cloud.url
        provider = self.account("owner@example.com", "provider")
        key = httpx.get(f"{self.url}/api/v1/me/access-key", headers=provider).json()["access_key"]
        self.user = self.account("dev@example.com", "user")
        self.other = self.account("other@example.com", "user")
        monkeypatch.setenv("SXWL_DATABASE_URL", db_url)  # for the admin's CLI
        create_admin(root / "cloud", "admin@example.com")
        self.admin = {"Authorization": f"Bearer {api_token(self.url, 'admin@example.com')}"}
        price = {"product": PRODUCT, "price_per_hour_yuan": "3600", "fee_percent": "10"}  # 1 CNY a second
        httpx.put(
            f"{self.url}/api/v1/admin/prices", headers=self.admin, json={"prices": [price]}
        ).raise_for_status()
        me = httpx.get(f"{self.url}/api/v1/me", headers=self.user).json()
        top_up = {"user_id": me["id"], "amount_yuan": "100000", "note": "test"}
        httpx.post(f"{self.url}/api/v1/admin/top-ups", headers=self.admin, json=top_up).raise_for_status()
        self.provider, self.key = provider, key
        self.agent: AgentProcess = self.start_agent("agent", "dev")
        self.others: list[AgentProcess] = []

    def start_agent(self, state: str, name: str) -> AgentProcess:
        return simulated_agent(
            self.url,
            self.root / state,
            self.key,
            "--tunnel-connections",
            "1",
            name=name,
            gpus=1,
            product=PRODUCT,
        )

    def tiny_llama(self) -> str:
        """The tiny Llama built here and registered as a public model, as an administrator does;
        its name."""
        env = {**os.environ, "SXWL_DATABASE_URL": self.db_url, "SXWL_DATA_DIR": str(self.root / "cloud")}
        register_public_model(MODEL, build_model(self.root / MODEL), env)
        return MODEL

    def account(self, email: str, role: str) -> dict[str, str]:
        body = {"email": email, "password": PASSWORD, "role": role}
        httpx.post(f"{self.url}/api/v1/auth/register", json=body).raise_for_status()
        return {"Authorization": f"Bearer {api_token(self.url, email)}"}

    def console(self, email: str) -> httpx.Client:
        return console(self.url, email)

    def close(self) -> None:
        """Stops every environment and waits until the agents say their processes ended (a job's
        processes outlive its agent by design), then the agents and the cloud."""
        try:
            stop_all(self.url, self.user)
        finally:
            try:
                for agent in self.others:
                    agent.stop()
                self.agent.stop()
            finally:
                self.cloud.stop()  # else it holds its database, and the next test's cloud is refused


def stop_all(cloud: str, user: dict[str, str]) -> None:
    """Stops the user's environments and waits for their CPods to report them ended."""
    ended = ("stopped", "failed")
    for env in httpx.get(f"{cloud}/api/v1/dev-envs", headers=user).json():
        if env["status"] not in ended:
            httpx.delete(f"{cloud}/api/v1/dev-envs/{env['id']}", headers=user)

    def all_ended() -> bool:
        return all(
            env["status"] in ended for env in httpx.get(f"{cloud}/api/v1/dev-envs", headers=user).json()
        )

    eventually(all_ended, timeout=60, what="every environment's processes to end")


def console(cloud: str, email: str) -> httpx.Client:
    """A browser-like client signed in to the console (its session cookie, nothing else)."""
    client = httpx.Client(base_url=cloud, timeout=30)
    page = client.get("/login")
    match = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert match, page.text
    form = {"csrf_token": match.group(1), "email": email, "password": PASSWORD}
    assert client.post("/login", data=form).status_code in (200, 303)
    assert client.cookies.get("sxwl_session")
    return client


@contextlib.contextmanager
def world_at(root: Path) -> Iterator[World]:
    """A World that is torn down whatever its test did: a cloud left running holds its database, and
    a ``SXWL_DATABASE_URL`` left set would send the worker's later clouds to it."""
    monkeypatch = pytest.MonkeyPatch()
    try:
        world = World(root, monkeypatch)
        try:
            yield world
        finally:
            world.close()
    finally:
        monkeypatch.undo()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with world_at(tmp_path_factory.mktemp("dev-envs")) as world:
        yield world


def _running(world: World, env_id: str) -> dict[str, Any] | None:
    env: dict[str, Any] = httpx.get(f"{world.url}/api/v1/dev-envs/{env_id}", headers=world.user).json()
    assert env["status"] in ("queued", "starting", "running"), env
    return env if env["status"] == "running" else None


def _status(world: World, env_id: str) -> str:
    status: str = httpx.get(f"{world.url}/api/v1/dev-envs/{env_id}", headers=world.user).json()["status"]
    return status


def kernel_says(cloud: str, browser: httpx.Client, env_id: str, kernel_id: str, code: str) -> str:
    """Runs ``code`` on the kernel over its WebSocket through the cloud; the result's text."""
    url = cloud.replace("http://", "ws://") + f"/dev/{env_id}/api/kernels/{kernel_id}/channels"
    cookie = "; ".join(f"{name}={value}" for name, value in browser.cookies.items())
    msg_id = uuid.uuid4().hex
    request = {
        "header": {
            "msg_id": msg_id,
            "msg_type": "execute_request",
            "username": "t",
            "session": "s",
            "version": "5.3",
        },
        "parent_header": {},
        "metadata": {},
        "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {}},
        "channel": "shell",
    }
    # The cloud holds a handshake up to 30 s while the CPod's agent is away (web/devenvs/proxy.py).
    with ws_client.connect(
        url, additional_headers={"Cookie": cookie, "Origin": cloud}, open_timeout=60
    ) as ws:
        ws.send(json.dumps(request))
        while True:
            message = json.loads(ws.recv(timeout=60))
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if message["msg_type"] == "execute_result":
                text: str = message["content"]["data"]["text/plain"]
                return text
            assert message["msg_type"] != "error", message


def _terminal_echoes(world: World, browser: httpx.Client, env_id: str, xsrf: str) -> str:
    """Opens a terminal and has its shell print something, over the terminal's WebSocket."""
    made = browser.post(f"/dev/{env_id}/api/terminals", headers={"X-XSRFToken": xsrf})
    assert made.status_code == 200, made.text
    url = world.url.replace("http://", "ws://") + f"/dev/{env_id}/terminals/websocket/{made.json()['name']}"
    cookie = "; ".join(f"{name}={value}" for name, value in browser.cookies.items())
    seen = ""
    with ws_client.connect(
        url, additional_headers={"Cookie": cookie, "Origin": world.url}, open_timeout=30
    ) as ws:
        ws.send(json.dumps(["stdin", "echo sum=$((20+22)); id -u\r"]))
        while "sum=42" not in seen:
            kind, *data = json.loads(ws.recv(timeout=60))
            if kind == "stdout":
                seen += data[0]
    return seen


def upload_notes(world: World) -> str:
    """The user's uploaded file notes.jsonl (one chat whose answer is "hello"): its id."""
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    uploaded = httpx.post(
        f"{world.url}/v1/files",
        headers=world.user,
        data={"purpose": "fine-tune"},
        files={"file": ("notes.jsonl", json.dumps(chat).encode() + b"\n", "application/jsonl")},
    )
    assert uploaded.status_code == 200, uploaded.text
    file_id: str = uploaded.json()["id"]
    return file_id


def test_a_dev_environment_runs_jupyterlab_reached_only_by_its_owner(world: World) -> None:
    created = httpx.post(
        f"{world.url}/api/v1/dev-envs",
        headers=world.user,
        json={
            "name": "explore",
            "gpus": 1,
            "gpu_product": PRODUCT,
            "models": [world.tiny_llama()],
            "files": [upload_notes(world)],
        },
    )
    assert created.status_code == 201, created.text
    env = created.json()
    env_id = env["id"]
    assert env["url"] == f"/dev/{env_id}/"
    assert env["mounts"] == [
        {"kind": "model", "name": MODEL, "path": "/sxwl/work/inputs/model-0"},
        {"kind": "file", "name": "notes.jsonl", "path": "/sxwl/work/inputs/file-0"},
    ]
    twin = httpx.post(f"{world.url}/api/v1/dev-envs", headers=world.user, json={"name": "explore"})
    assert twin.status_code == 409 and twin.json()["error"]["details"][0]["field"] == "name"
    eventually(lambda: _running(world, env_id), timeout=60, what="the environment to run")
    browser = world.console("dev@example.com")
    base = f"/dev/{env_id}"

    # JupyterLab answers through the tunnel once it has started (its socket appears).
    eventually(lambda: browser.get(f"{base}/api/status").status_code == 200, timeout=90, what="JupyterLab")
    lab = browser.get(f"{base}/lab")
    assert lab.status_code == 200 and "JupyterLab" in lab.text
    xsrf = browser.cookies.get("_xsrf")
    assert xsrf, "JupyterLab set its XSRF cookie through the proxy"
    assert browser.cookies.get("sxwl_session"), "the cloud's own cookie is untouched"
    contents = browser.get(f"{base}/api/contents")
    assert contents.status_code == 200 and contents.json()["type"] == "directory"

    # Its XSRF check is on even though the cloud adds the token: a write without it is refused.
    note = {"type": "file", "format": "text", "content": "kept in the workspace\n"}
    assert browser.put(f"{base}/api/contents/hello.txt", json=note).status_code == 403
    written = browser.put(f"{base}/api/contents/hello.txt", json=note, headers={"X-XSRFToken": xsrf})
    assert written.status_code == 201, written.text
    read = browser.get(f"{base}/api/contents/hello.txt").json()
    assert read["content"] == "kept in the workspace\n"

    # A kernel, over its WebSocket through the cloud and the tunnel.
    kernel = browser.post(f"{base}/api/kernels", json={"name": "python3"}, headers={"X-XSRFToken": xsrf})
    assert kernel.status_code == 201, kernel.text
    assert kernel_says(world.url, browser, env_id, kernel.json()["id"], "1+1") == "2"
    wrote = kernel_says(world.url, browser, env_id, kernel.json()["id"], "open('hello.txt').read().strip()")
    assert wrote == "'kept in the workspace'"
    # The mounted model and file are there, read-only.
    config = "import json; json.load(open('/sxwl/work/inputs/model-0/config.json'))['model_type']"
    assert kernel_says(world.url, browser, env_id, kernel.json()["id"], config) == "'llama'"
    mounted = "import json; json.load(open('/sxwl/work/inputs/file-0'))['messages'][1]['content']"
    assert kernel_says(world.url, browser, env_id, kernel.json()["id"], mounted) == "'hello'"
    for mount in ("model-0/config.json", "file-0"):
        check = f"import os; os.access('/sxwl/work/inputs/{mount}', os.W_OK)"
        assert kernel_says(world.url, browser, env_id, kernel.json()["id"], check) == "False"
    # A terminal, over its WebSocket.
    assert "sum=42" in _terminal_echoes(world, browser, env_id, xsrf)

    # Nobody else gets in: another user, an admin's console, no session, another site's page.
    other = world.console("other@example.com")
    assert other.get(f"{base}/api/contents").status_code == 404
    admin = world.console("admin@example.com")
    assert admin.get(f"{base}/api/contents").status_code == 404
    assert httpx.get(f"{world.url}{base}/api/contents").status_code == 401
    bearer = httpx.get(f"{world.url}{base}/api/contents", headers=world.user)
    assert bearer.status_code == 401, "only the console's session opens an environment"
    assert httpx.get(f"{world.url}/api/v1/dev-envs/{env_id}", headers=world.other).status_code == 404
    cookie = "; ".join(f"{name}={value}" for name, value in browser.cookies.items())
    url = world.url.replace("http://", "ws://") + f"{base}/api/kernels/{kernel.json()['id']}/channels"
    with pytest.raises(InvalidStatus):
        ws_client.connect(url, additional_headers={"Cookie": cookie, "Origin": "http://evil.example"})
    # The token never reached the browser.
    secret = (world.root / "agent" / "workspaces" / env_id / ".sxwl-dev" / "token").read_text()
    assert secret not in lab.text and secret not in str(browser.cookies.items())

    # Paused: the processes end, the workspace stays; resumed on the same CPod with a new token.
    first_job = env["job_id"]
    paused = httpx.post(f"{world.url}/api/v1/dev-envs/{env_id}/pause", headers=world.user)
    assert paused.status_code == 200 and paused.json()["status"] in ("pausing", "paused"), paused.text
    assert paused.json()["reason"] == "paused by dev@example.com"
    eventually(lambda: _status(world, env_id) == "paused", timeout=60, what="the environment to pause")
    assert browser.get(f"{base}/api/contents").status_code == 409
    again = httpx.post(f"{world.url}/api/v1/dev-envs/{env_id}/pause", headers=world.user)
    assert again.status_code == 409, again.text
    assert again.json()["error"]["details"]["status"] == "paused", again.text
    resumed = httpx.post(f"{world.url}/api/v1/dev-envs/{env_id}/resume", headers=world.user)
    assert resumed.status_code == 200, resumed.text
    env = resumed.json()
    assert env["job_id"] != first_job
    eventually(lambda: _running(world, env_id), timeout=60, what="the environment to run again")
    eventually(lambda: browser.get(f"{base}/api/status").status_code == 200, timeout=90, what="JupyterLab")
    kept = browser.get(f"{base}/api/contents/hello.txt")
    assert kept.status_code == 200 and kept.json()["content"] == "kept in the workspace\n"
    assert env["cpod_id"] == paused.json()["cpod_id"]

    # Stopped: billing ends, the name is free again, and what it cost is in the ledger.
    stopped = httpx.delete(f"{world.url}/api/v1/dev-envs/{env_id}", headers=world.user)
    assert stopped.status_code == 200 and stopped.json()["status"] in ("stopping", "stopped")
    assert httpx.delete(f"{world.url}/api/v1/dev-envs/{env_id}", headers=world.user).status_code == 409

    def final() -> dict[str, Any] | None:
        got: dict[str, Any] = httpx.get(f"{world.url}/api/v1/dev-envs/{env_id}", headers=world.user).json()
        return got if got["status"] == "stopped" and got["cost_per_hour"] == 0 else None

    done = eventually(final, timeout=60, what="the environment to stop")
    job = httpx.get(f"{world.url}/api/v1/jobs/{env['job_id']}", headers=world.user).json()
    assert done["cost"] > 0, json.dumps(job)
    month = done["created_at"][:7]

    def rated(job_id: str) -> int:
        statement = httpx.get(f"{world.url}/api/v1/billing/statement?month={month}", headers=world.user)
        return sum(line["gross"] for line in statement.json()["lines"] if line["job_id"] == job_id)

    eventually(
        lambda: rated(env["job_id"]) == done["cost"], timeout=30, what="its usage rated into the ledger"
    )
    # The run before the pause was billed until it ended, and nothing while paused.
    before_pause = httpx.get(f"{world.url}/api/v1/jobs/{first_job}", headers=world.user).json()
    assert before_pause["state"] == "cancelled" and before_pause["cost"] > 0
    assert rated(first_job) == before_pause["cost"]
    assert (
        httpx.get(f"{world.url}/api/v1/dev-envs/{env_id}", headers=world.user).json()["cost"] == done["cost"]
    )
    assert browser.get(f"{base}/api/contents").status_code == 409


def test_bad_requests_name_the_field_and_start_nothing(world: World) -> None:
    def create(**body: Any) -> httpx.Response:
        return httpx.post(f"{world.url}/api/v1/dev-envs", headers=world.user, json=body)

    def listed() -> list[tuple[str, str]]:
        # Ids and names only: an earlier test's environment may still be finishing its stop.
        envs = httpx.get(f"{world.url}/api/v1/dev-envs", headers=world.user).json()
        return [(env["id"], env["name"]) for env in envs]

    before = listed()
    refused = create(name="bad", gpus=-1)
    assert refused.status_code == 422 and "gpus" in json.dumps(refused.json()["error"]["details"])
    unknown = create(name="bad", models=["no-such-model"])
    assert unknown.status_code == 404
    assert unknown.json()["error"]["details"][0]["field"] == "models[0]"
    not_mine = create(name="bad", files=["file-nope"])
    assert not_mine.status_code == 404 and not_mine.json()["error"]["details"][0]["field"] == "files[0]"
    timeout = create(name="bad", idle_timeout_min=0)
    assert timeout.status_code == 422 and "idle_timeout_min" in json.dumps(timeout.json()["error"]["details"])
    assert listed() == before


def _sxwl(*args: str, env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sxwl.cli", *args]
    return subprocess.run(command, input=stdin, env=env, capture_output=True, text=True, timeout=60)


def test_the_cli_creates_lists_shows_opens_pauses_resumes_and_stops(world: World, tmp_path: Path) -> None:
    env = {**os.environ, "SXWL_CONFIG_DIR": str(tmp_path / "cfg"), "COLUMNS": "200"}
    login = _sxwl(
        "login", "--url", world.url, "--email", "dev@example.com", "--password-stdin", env=env, stdin=PASSWORD
    )
    assert login.returncode == 0, login.stderr
    bad = _sxwl("dev", "create", "--gpus", "-1", env=env)
    assert bad.returncode == 2 and "--gpus" in bad.stderr
    unknown = _sxwl("dev", "create", "--name", "cli", "--model", "nope", env=env)
    assert unknown.returncode == 1 and "models[0]" in unknown.stderr
    # No CPU price is set, so it waits in the queue: enough for every command but open's page.
    created = _sxwl("dev", "create", "--name", "cli", env=env)
    assert created.returncode == 0, created.stderr
    env_id = re.search(r"dev environment (\w+)", created.stdout).group(1)  # type: ignore[union-attr]
    listed = _sxwl("dev", "list", env=env)
    assert env_id[:12] in listed.stdout and "queued" in listed.stdout
    shown = _sxwl("dev", "show", env_id[:8], env=env)
    assert f"{world.url}/dev/{env_id}/" in shown.stdout, shown.stdout
    opened = _sxwl("dev", "open", env_id, "--no-browser", env=env)
    assert f"{world.url}/dev/{env_id}/" in opened.stdout
    paused = _sxwl("dev", "pause", env_id, env=env)
    assert paused.returncode == 0 and "paused" in paused.stdout, paused.stderr
    resumed = _sxwl("dev", "resume", env_id, env=env)
    assert resumed.returncode == 0 and "queued" in resumed.stdout, resumed.stderr
    kept = _sxwl("dev", "stop", env_id, env=env, stdin="n\n")
    assert kept.returncode == 1 and _status(world, env_id) == "queued"
    stopped = _sxwl("dev", "stop", env_id, "--yes", env=env)
    assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stderr


def test_the_console_page_creates_lists_and_stops_in_both_languages(world: World) -> None:
    browser = world.console("dev@example.com")
    page = browser.get("/dev-envs")
    assert page.status_code == 200 and "开发环境" in page.text
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    refused = browser.post("/dev-envs", data={"csrf_token": token, "name": "page", "idle_timeout_min": "0"})
    assert refused.status_code == 422 and "取值无效" in refused.text
    made = browser.post("/dev-envs", data={"csrf_token": token, "name": "page", "gpus": "0"})
    assert made.status_code == 303 and made.headers["location"] == "/dev-envs?notice=dev_created"
    mine = httpx.get(f"{world.url}/api/v1/dev-envs", headers=world.user).json()
    (env,) = [e for e in mine if e["name"] == "page" and e["status"] == "queued"]
    browser.cookies.set("sxwl_lang", "en")
    listed = browser.get("/dev-envs?notice=dev_created")
    assert "Dev environments" in listed.text and f'data-env="{env["id"]}"' in listed.text
    assert "Queued" in listed.text and "Dev environment created" in listed.text
    other = world.console("other@example.com")
    other_token = re.search(r'name="csrf_token" value="([^"]+)"', other.get("/dev-envs").text).group(1)  # type: ignore[union-attr]
    assert other.post(f"/dev-envs/{env['id']}/stop", data={"csrf_token": other_token}).status_code == 404
    stopped = browser.post(f"/dev-envs/{env['id']}/stop", data={"csrf_token": token})
    assert stopped.status_code == 303 and _status(world, env["id"]) == "stopped"


def test_ssh_and_scp_through_the_cloud_with_the_keys_on_the_account(world: World, tmp_path: Path) -> None:
    env = {**os.environ, "SXWL_CONFIG_DIR": str(tmp_path / "cfg"), "COLUMNS": "200"}
    login = _sxwl(
        "login", "--url", world.url, "--email", "dev@example.com", "--password-stdin", env=env, stdin=PASSWORD
    )
    assert login.returncode == 0, login.stderr
    for name in ("mine", "stranger"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / name)], check=True
        )
    (tmp_path / "private.pub").write_text((tmp_path / "mine").read_text())
    refused = _sxwl("ssh-keys", "add", str(tmp_path / "private.pub"), env=env)
    assert refused.returncode == 2 and "public_key" in refused.stderr
    added = _sxwl("ssh-keys", "add", str(tmp_path / "mine.pub"), env=env)
    assert added.returncode == 0 and "SHA256:" in added.stdout, added.stderr
    body = {"name": "shell", "gpus": 1, "gpu_product": PRODUCT}
    env_id = httpx.post(f"{world.url}/api/v1/dev-envs", headers=world.user, json=body).json()["id"]
    eventually(lambda: _running(world, env_id), timeout=60, what="the environment to run")
    browser = world.console("dev@example.com")
    eventually(
        lambda: browser.get(f"/dev/{env_id}/api/status").status_code == 200, timeout=90, what="JupyterLab"
    )
    config = _sxwl("dev", "ssh-config", env_id, env=env)
    assert f"HostName {env_id}" in config.stdout and "ProxyCommand" in config.stdout

    def ssh(key: str, *command: str, program: str = "ssh") -> subprocess.CompletedProcess[str]:
        options = ["-F", "/dev/null", "-i", str(tmp_path / key), "-o", "StrictHostKeyChecking=no", "-o",
                   f"UserKnownHostsFile={tmp_path / 'known_hosts'}", "-o", "BatchMode=yes",
                   "-o", f"ProxyCommand={sys.executable} -m sxwl.cli dev ssh-proxy {env_id}"]  # fmt: skip
        argv = [program, *options, *command]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)

    said = ssh("mine", f"sxwl@{env_id}", "echo hello > from-ssh.txt; pwd; id -u")
    assert said.returncode == 0, said.stderr
    where, uid = said.stdout.split()
    assert where == "/sxwl/work" and int(uid) >= 2_000_000_000  # the attempt's own uid, in its sandbox
    (tmp_path / "up.txt").write_text("copied by scp\n")
    copied = ssh("mine", str(tmp_path / "up.txt"), f"sxwl@{env_id}:up.txt", program="scp")
    assert copied.returncode == 0, copied.stderr
    both = ssh("mine", f"sxwl@{env_id}", "cat from-ssh.txt up.txt")
    assert both.stdout == "hello\ncopied by scp\n", both.stderr
    assert browser.get(f"/dev/{env_id}/api/contents/up.txt").json()["content"] == "copied by scp\n"
    stranger = ssh("stranger", f"sxwl@{env_id}", "true")
    assert stranger.returncode == 255 and "Permission denied" in stranger.stderr
    assert httpx.delete(f"{world.url}/api/v1/dev-envs/{env_id}", headers=world.user).status_code == 200


def test_an_environment_nobody_uses_is_paused_after_its_idle_timeout_and_says_why(world: World) -> None:
    body = {"name": "forgotten", "gpus": 1, "gpu_product": PRODUCT, "idle_timeout_min": 1}
    created = httpx.post(f"{world.url}/api/v1/dev-envs", headers=world.user, json=body)
    assert created.status_code == 201, created.text
    env_id = created.json()["id"]
    eventually(lambda: _running(world, env_id), timeout=60, what="the environment to run")

    def paused() -> dict[str, Any] | None:
        env: dict[str, Any] = httpx.get(f"{world.url}/api/v1/dev-envs/{env_id}", headers=world.user).json()
        return env if env["status"] == "paused" else None

    env = eventually(paused, timeout=180, what="the idle environment to be paused")
    assert env["reason"] == "paused after 1 min without activity"
    assert httpx.delete(f"{world.url}/api/v1/dev-envs/{env_id}", headers=world.user).status_code == 200


def test_a_paused_environment_whose_cpod_is_revoked_resumes_on_another_with_its_workspace(
    world: World,
) -> None:
    body = {"name": "moving", "gpus": 1, "gpu_product": PRODUCT}
    env = httpx.post(f"{world.url}/api/v1/dev-envs", headers=world.user, json=body).json()
    env_id, base = env["id"], f"/dev/{env['id']}"
    first = eventually(lambda: _running(world, env_id), timeout=60, what="the environment to run")
    browser = world.console("dev@example.com")
    eventually(lambda: browser.get(f"{base}/api/status").status_code == 200, timeout=90, what="JupyterLab")
    browser.get(f"{base}/lab")
    note = {"type": "file", "format": "text", "content": "survives a lost CPod\n"}
    xsrf = {"X-XSRFToken": browser.cookies.get("_xsrf") or ""}
    assert (
        browser.put(f"{base}/api/contents/notes", json={"type": "directory"}, headers=xsrf).status_code == 201
    )
    assert browser.put(f"{base}/api/contents/notes/keep.txt", json=note, headers=xsrf).status_code == 201
    assert httpx.post(f"{world.url}/api/v1/dev-envs/{env_id}/pause", headers=world.user).status_code == 200

    def saved() -> dict[str, Any] | None:
        got: dict[str, Any] = httpx.get(f"{world.url}/api/v1/dev-envs/{env_id}", headers=world.user).json()
        return got if got["status"] == "paused" and got["saved_workspace_bytes"] else None

    eventually(saved, timeout=60, what="the paused environment's workspace saved")
    world.others.append(world.start_agent("agent-b", "dev-b"))
    revoked = httpx.delete(f"{world.url}/api/v1/cpods/{first['cpod_id']}", headers=world.provider)
    assert revoked.status_code in (200, 204), revoked.text
    resumed = httpx.post(f"{world.url}/api/v1/dev-envs/{env_id}/resume", headers=world.user)
    assert resumed.status_code == 200, resumed.text
    running = eventually(lambda: _running(world, env_id), timeout=90, what="the environment to run elsewhere")
    assert running["cpod_id"] != first["cpod_id"]
    eventually(lambda: browser.get(f"{base}/api/status").status_code == 200, timeout=90, what="JupyterLab")
    kept = browser.get(f"{base}/api/contents/notes/keep.txt")
    assert kept.status_code == 200 and kept.json()["content"] == "survives a lost CPod\n"
    assert httpx.delete(f"{world.url}/api/v1/dev-envs/{env_id}", headers=world.user).status_code == 200
