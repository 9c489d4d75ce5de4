"""The CPod's input cache is bounded by what it holds on disk (docs/agent.md, "Inputs and the
cache"): an unpacked archive counts its files, not the few bytes a compressed archive of zeros
takes, so the cap evicts it; and an archive whose files add up to more than the model limit, which
the cloud sends with each assignment, is refused from its headers before any of it is unpacked.
Against real archives, a real ``InputCache`` and ``JobSync``, a stand-in for the cloud's agent
routes on loopback, and the real cloud's assignments."""

from __future__ import annotations

import io
import os
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from sxwl.agent.client import CloudClient
from sxwl.agent.inputs import InputCache, InputError
from sxwl.agent.jobsync import JobSync
from sxwl.agent.runtimes.local import LocalJob
from sxwl.protocol import AssignmentsReply
from sxwl.protocol.models import Assignment
from tests.support.agent import eventually
from tests.support.input_server import JOB, Served, input_path, job_input, servers
from tests.support.threads import run_on_thread
from tests.test_agent_inputs_sync import until, with_sync
from tests.test_fine_tunes_api import FineTunes

__all__ = ["servers"]  # the fixture
TOKEN = "sxcp_test-token"
MIB = 1024 * 1024


def zeros_archive(unpacked: int, *, gzip: bool = True) -> bytes:
    """A model-like archive whose weights are ``unpacked`` bytes of zeros: a gzip of them is tiny."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if gzip else "w") as tar:
        for name, data in (("config.json", b"{}"), ("weights.bin", bytes(unpacked))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def claimed_archive(claimed: int) -> bytes:
    """An uncompressed tar whose one member's header claims ``claimed`` bytes, with a few present:
    only a reader of headers alone can judge it (an unpacker would fail on the missing data)."""
    info = tarfile.TarInfo("weights.bin")
    info.size = claimed
    return info.tobuf(format=tarfile.GNU_FORMAT) + bytes(4096)


def fetch_into(
    cloud: Served, root: Path, data: bytes, max_bytes: int | None, limit: int | None
) -> tuple[Path, dict[str, int]]:
    """The archive fetched into the cache at ``root``, and what that cache then reports."""
    cloud.bodies[input_path("model")] = data

    async def fetch() -> tuple[Path, dict[str, int]]:
        client = CloudClient(cloud.url)
        try:
            cache = InputCache(root, client, max_bytes)
            path = await cache.fetch(TOKEN, JOB, 1, job_input("model", data, archive=True), limit)
            return path, {e.sha256: e.size for e in cache.entries()}
        finally:
            await client.close()

    return run_on_thread(fetch())


def test_an_unpacked_archive_counts_its_files_and_the_cap_evicts_it(
    servers: tuple[Served, Served], tmp_path: Path
) -> None:
    cloud, _ = servers
    root = tmp_path / "cache"
    bomb = zeros_archive(16 * MIB)
    assert len(bomb) < 100_000  # a sliver of what it unpacks to
    tree, held = fetch_into(cloud, root, bomb, 24 * MIB, None)
    assert sum(f.stat().st_size for f in tree.rglob("*") if f.is_file()) == 16 * MIB + 2
    assert held == {tree.name.removesuffix(".d"): 16 * MIB + 2}  # what the heartbeat reports
    an_hour_ago = time.time() - 3600
    os.utime(tree, (an_hour_ago, an_hour_ago))
    second, held = fetch_into(cloud, root, zeros_archive(12 * MIB), 24 * MIB, None)
    assert not tree.exists() and second.exists()  # 28 MiB would pass the cap: the older one went
    assert held == {second.name.removesuffix(".d"): 12 * MIB + 2}


@pytest.mark.parametrize(
    ("data", "limit"),
    [(claimed_archive(2 * 1024 * MIB), 1024 * MIB), (zeros_archive(32 * MIB), 8 * MIB)],
    ids=["header-claims-2-GiB", "gzip-of-32-MiB"],
)
def test_an_archive_past_the_model_limit_is_refused_before_it_is_unpacked(
    servers: tuple[Served, Served], tmp_path: Path, data: bytes, limit: int
) -> None:
    cloud, _ = servers
    root = tmp_path / "cache"
    with pytest.raises(InputError, match=rf"model limit \({limit} bytes\); refused before unpacking"):
        fetch_into(cloud, root, data, None, limit)
    assert [p for p in root.rglob("*") if not p.is_dir()] == []  # nothing written, nothing left
    assert sorted(p.name for p in root.iterdir()) == [".pending", ".tmp"]
    assert list((root / ".tmp").iterdir()) == []


def test_the_cloud_sends_the_model_limit_and_the_agent_refuses_past_it(
    make_client: Callable[..., TestClient], servers: tuple[Served, Served], tmp_path: Path
) -> None:
    ft = FineTunes(make_client(model_max_bytes=4 * MIB))
    ft.created()
    (sent,) = eventually(lambda: ft.poll()["assignments"], what="the assignment")
    assert sent["archive_max_bytes"] == 4 * MIB

    cloud, _ = servers
    bomb = zeros_archive(8 * MIB)
    cloud.bodies[input_path("model")] = bomb
    given = Assignment(
        job_id=JOB,
        attempt=1,
        name="t",
        owner_id="u",
        command="true",
        gpus_per_node=0,
        nodes=1,
        inputs=[job_input("model", bomb, archive=True)],
        archive_max_bytes=sent["archive_max_bytes"],
    )

    async def body(sync: JobSync[LocalJob]) -> bool:
        await sync.handle(AssignmentsReply(assignments=[given]))
        await until(lambda: not sync.preparing)
        return sync.runtime.knows(JOB, 1)

    assert with_sync(cloud, tmp_path / "state", body) is False  # never started
    failed = cloud.reports[-1]
    assert failed["state"] == "failed" and "could not fetch input model" in failed["reason"]
    assert f"model limit ({4 * MIB} bytes)" in failed["reason"]
