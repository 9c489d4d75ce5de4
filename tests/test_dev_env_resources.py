"""Dev environments' cores, memory and storage (docs/dev-envs.md, docs/billing.md), end to end with
`sxwl serve` and real agents running real JupyterLabs: ``cpus`` and ``memory_gib`` checked, placed,
put in the attempt's cgroup and billed per core-second without GPUs; a paused environment's saved
workspace charged per GiB-day once per day, even with a second replica charging; a resume that
leaves a full CPod for one with room, its workspace restored; and a stopped environment's
workspaces removed from every CPod it ran on and its saved tars from the artifact store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from sxwl.agent.runtimes import cgroups
from sxwl.agent.runtimes.cgroups import CPU_PERIOD_US
from sxwl.agent.runtimes.local import LocalRuntime
from sxwl.cloud.db.money_models import StorageCharge
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.devenvs import storage
from sxwl.cloud.services.money import ledger
from sxwl.protocol.devenvs import MAX_CPUS
from sxwl.protocol.money import cost
from tests.support.agent import eventually
from tests.support.metering import context
from tests.test_dev_envs import PRODUCT, World, world_at

pytest.importorskip("jupyterlab", reason="JupyterLab comes with the devenv extra")

CPU_PRICE = "3600"  # CNY per core-hour: 1 CNY a core-second
STORAGE_PRICE = "100000"  # CNY per GiB-day: a small saved workspace still costs whole micro-yuan


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with world_at(tmp_path_factory.mktemp("dev-env-resources")) as world:
        yield world


def _price(world: World, resource: str, price: str) -> None:
    body = {"prices": [{"resource": resource, "price_per_hour_yuan": price, "fee_percent": "10"}]}
    httpx.put(f"{world.url}/api/v1/admin/prices", headers=world.admin, json=body).raise_for_status()


def _env(world: World, env_id: str) -> dict[str, Any]:
    got: dict[str, Any] = httpx.get(f"{world.url}/api/v1/dev-envs/{env_id}", headers=world.user).json()
    return got


def _status_is(world: World, env_id: str, *wanted: str) -> dict[str, Any] | None:
    env = _env(world, env_id)
    return env if env["status"] in wanted else None


def _statement(world: World) -> dict[str, Any]:
    month = utcnow().strftime("%Y-%m")
    found: dict[str, Any] = httpx.get(
        f"{world.url}/api/v1/billing/statement?month={month}", headers=world.user
    ).json()
    return found


def _ledger_ok(world: World) -> None:
    ctx = context(world.root / "check", f"sqlite:///{world.root / 'sxwl.db'}")
    try:
        with ctx.db.session() as session:
            report = ledger.check(session)
        assert report.ok, report
    finally:
        ctx.db.engine.dispose()


def _cgroup_value(name: str, *files: str) -> str | None:
    """The first of ``files`` found in the attempt's cgroup ``name``, in any hierarchy."""
    for base in cgroups.find().bases:
        for file in files:
            if (base / name / file).exists():
                return (base / name / file).read_text().strip()
    return None


def _online(world: World, count: int) -> list[dict[str, Any]] | None:
    found: list[dict[str, Any]] = httpx.get(f"{world.url}/api/v1/cpods", headers=world.provider).json()
    return found if len(found) == count and all(c["status"] == "online" for c in found) else None


def _write_note(world: World, env_id: str, text: str) -> httpx.Client:
    browser = world.console("dev@example.com")
    base = f"/dev/{env_id}"
    eventually(lambda: browser.get(f"{base}/api/status").status_code == 200, timeout=90, what="JupyterLab")
    browser.get(f"{base}/lab")
    xsrf = {"X-XSRFToken": browser.cookies.get("_xsrf") or ""}
    note = {"type": "file", "format": "text", "content": text}
    assert browser.put(f"{base}/api/contents/keep.txt", json=note, headers=xsrf).status_code == 201
    return browser


def test_cores_and_memory_are_checked_placed_enforced_and_billed_per_core(world: World) -> None:
    def create(**body: Any) -> httpx.Response:
        return httpx.post(f"{world.url}/api/v1/dev-envs", headers=world.user, json=body)

    for field, value in (("cpus", 0), ("memory_gib", 0), ("cpus", MAX_CPUS + 1), ("memory_gib", "lots")):
        refused = create(name="bad", **{field: value})
        assert refused.status_code == 422, refused.text
        assert field in json.dumps(refused.json()["error"]["details"]), refused.text

    (cpod,) = eventually(lambda: _online(world, 1), timeout=120, what="the CPod online")

    # More cores than any node has: it says so while it waits (before the price: no node would ever
    # do, whatever it cost), and starts nothing.
    huge = create(name="huge", cpus=MAX_CPUS).json()
    waiting = eventually(
        lambda: (e := _env(world, huge["id"]))["reason"] and "CPU cores" in e["reason"] and e,
        what="the reason the huge environment waits",
    )
    assert waiting["status"] == "queued"
    assert waiting["reason"] == f"no online CPod offers a CPU-only node with {MAX_CPUS} CPU cores"
    assert httpx.delete(f"{world.url}/api/v1/dev-envs/{huge['id']}", headers=world.user).status_code == 200

    _price(world, "cpu", CPU_PRICE)
    cores = min(2, cpod["nodes"][0]["cpu_cores"])
    created = create(name="cores", cpus=cores, memory_gib=1)
    assert created.status_code == 201, created.text
    assert (created.json()["cpus"], created.json()["memory_gib"]) == (cores, 1)
    env_id = created.json()["id"]
    running = eventually(lambda: _status_is(world, env_id, "running"), timeout=60, what="it to run")
    job_id = running["job_id"]

    # The attempt's own cgroup holds what it asked for: a CPU quota of its cores, 1 GiB of memory.
    if cgroups.find().usable:
        name = LocalRuntime(world.root / "agent", []).cgroup_name(job_id, 1)
        quota = _cgroup_value(name, "cpu.max", "cpu.cfs_quota_us")
        assert quota in (f"{cores * CPU_PERIOD_US} {CPU_PERIOD_US}", str(cores * CPU_PERIOD_US)), quota
        assert _cgroup_value(name, "memory.max", "memory.limit_in_bytes") == str(2**30)

    page = world.console("dev@example.com").get("/dev-envs")  # zh-CN, the console's default
    assert f"{cores} 核 · 1 GiB" in page.text

    assert httpx.post(f"{world.url}/api/v1/dev-envs/{env_id}/pause", headers=world.user).status_code == 200
    paused = eventually(
        lambda: (e := _status_is(world, env_id, "paused")) and e["cost_per_hour"] == 0 and e,
        timeout=60,
        what="it paused",
    )

    def line() -> dict[str, Any] | None:
        lines = [x for x in _statement(world)["lines"] if x["job_id"] == job_id]
        return lines[0] if lines and lines[0]["gross"] == _env(world, env_id)["cost"] else None

    # Billed per core-second at the CPU price: its cores are the units of its one usage line.
    charged = eventually(line, timeout=30, what="its usage rated into the ledger")
    assert charged["resource"] == "cpu" and charged["units"] == cores
    assert charged["unit_price"] == int(CPU_PRICE) * 1_000_000
    assert charged["gross"] == cost(cores, charged["unit_price"], charged["usage_us"]) > 0
    assert paused["cost"] == charged["gross"]
    _ledger_ok(world)
    assert httpx.delete(f"{world.url}/api/v1/dev-envs/{env_id}", headers=world.user).status_code == 200


def test_storage_is_charged_daily_a_full_cpod_is_left_and_a_stopped_env_leaves_nothing(world: World) -> None:
    created = httpx.post(
        f"{world.url}/api/v1/dev-envs",
        headers=world.user,
        json={"name": "kept", "gpus": 1, "gpu_product": PRODUCT},
    )
    env_id = created.json()["id"]
    first = eventually(lambda: _status_is(world, env_id, "running"), timeout=60, what="it to run")
    _write_note(world, env_id, "kept through a full CPod\n")
    assert httpx.post(f"{world.url}/api/v1/dev-envs/{env_id}/pause", headers=world.user).status_code == 200
    saved = eventually(
        lambda: (e := _status_is(world, env_id, "paused")) and e["saved_workspace_bytes"] and e,
        timeout=60,
        what="its workspace saved",
    )

    # Storage: one charge for today, whichever replica charges; nothing for the provider.
    _price(world, "storage", STORAGE_PRICE)
    day = utcnow().date().isoformat()
    expected = storage.day_cost(int(STORAGE_PRICE) * 1_000_000, saved["saved_workspace_bytes"])
    kept = eventually(
        lambda: [s for s in _statement(world)["storage"] if s["dev_env_id"] == env_id],
        timeout=30,
        what="today's storage charged",
    )
    assert kept == [
        {
            "dev_env_id": env_id,
            "name": "kept",
            "day": day,
            "bytes": saved["saved_workspace_bytes"],
            "price_per_gib_day": int(STORAGE_PRICE) * 1_000_000,
            "gross": expected,
        }
    ]
    replica = context(world.root / "replica", f"sqlite:///{world.root / 'sxwl.db'}")
    try:
        assert storage.charge_once(replica) == 0
        with replica.db.session() as session:
            charges = session.scalar(
                select(func.count()).select_from(StorageCharge).where(StorageCharge.dev_env_id == env_id)
            )
            assert charges == 1
            assert ledger.balance(session, ledger.account_key(ledger.PLATFORM_STORAGE)) == expected
    finally:
        replica.db.engine.dispose()
    assert _env(world, env_id)["storage_cost"] == expected
    csv = httpx.get(f"{world.url}/api/v1/billing/statement?format=csv", headers=world.user).text
    assert f"{env_id},kept,{day},saved workspace," in csv
    _ledger_ok(world)
    _price(world, "storage", "0")  # the rest of the test is not about storage

    # Its CPod is full (a job holds its one GPU) and another has room: resume goes there.
    hog = httpx.post(
        f"{world.url}/api/v1/jobs",
        headers=world.user,
        json={"name": "hog", "command": "sleep 600", "gpus_per_node": 1, "gpu_product": PRODUCT},
    ).json()
    eventually(
        lambda: (
            httpx.get(f"{world.url}/api/v1/jobs/{hog['id']}", headers=world.user).json()["state"] == "running"
        ),
        timeout=60,
        what="the job holding the first CPod's GPU",
    )
    world.others.append(world.start_agent("agent-b", "dev-b"))
    eventually(lambda: _online(world, 2), timeout=120, what="the second CPod online")
    resumed = httpx.post(f"{world.url}/api/v1/dev-envs/{env_id}/resume", headers=world.user)
    assert resumed.status_code == 200, resumed.text
    moved = eventually(lambda: _status_is(world, env_id, "running"), timeout=90, what="it to run elsewhere")
    assert moved["cpod_id"] != first["cpod_id"]
    browser = world.console("dev@example.com")
    base = f"/dev/{env_id}"
    eventually(lambda: browser.get(f"{base}/api/status").status_code == 200, timeout=90, what="JupyterLab")
    restored = browser.get(f"{base}/api/contents/keep.txt")
    assert restored.status_code == 200 and restored.json()["content"] == "kept through a full CPod\n"
    httpx.post(f"{world.url}/api/v1/jobs/{hog['id']}/cancel", headers=world.user)

    # Stopped: each CPod it ran on removes its workspace; the store drops every tar it saved.
    job_ids = {first["job_id"], moved["job_id"]}
    folders = [world.root / "agent" / "workspaces" / env_id, world.root / "agent-b" / "workspaces" / env_id]
    assert all(folder.is_dir() for folder in folders)
    assert httpx.delete(f"{world.url}/api/v1/dev-envs/{env_id}", headers=world.user).status_code == 200
    eventually(
        lambda: not any(folder.exists() for folder in folders), timeout=60, what="the workspaces removed"
    )

    def tars() -> list[Path]:
        return [
            p
            for job_id in job_ids
            for p in (world.root / "cloud" / "artifacts").glob(f"{job_id}*/workspace.tar")
        ]

    def listed() -> list[str]:
        return [
            a["path"]
            for job_id in job_ids
            for a in httpx.get(f"{world.url}/api/v1/jobs/{job_id}/artifacts", headers=world.user).json()
        ]

    eventually(
        lambda: not tars() and "workspace.tar" not in listed(), timeout=60, what="the saved tars deleted"
    )
    assert _env(world, env_id)["saved_workspace_bytes"] is None
