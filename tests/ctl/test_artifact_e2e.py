"""The provider's first steps with nothing but the cloud: an artifact (the real 3kctl zipapp, the other
files stand-ins as in the other ctl tests) served by a running cloud, downloaded with `wget` inside a
network namespace whose only route is the link to the cloud (no registry, no internet), unpacked,
verified by its own 3kctl under the system's python3, and `deploy all` from it dialling the cloud the
artifact came from with no --cloud: a dry run there, then, on this host (the sshd hosts listen on its
loopback), the deployment with KubeKey and helm stood in and recorded, until the CPod is online."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sxwl.artifactbuild.pack import tar_gz
from sxwl.ctl import zipapp
from sxwl.ctl.artifact import write_checksums
from sxwl.ctl.sample import SAMPLE_CONFIG
from tests.ctl.conftest import MakeHosts, make_artifact
from tests.ctl.hosts import config_text
from tests.ctl.test_deploy import provider_key
from tests.support.agent import AgentProcess
from tests.support.cloud import CloudProcess
from tests.support.net import free_port

SYSTEM_PYTHON = "/usr/bin/python3"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("wget") is None,
    reason="needs root, ip and wget (network namespaces)",
)


@pytest.fixture
def offline() -> Iterator[tuple[str, str]]:
    """A namespace linked only to this host by a /30: (its name, this host's address on the link)."""
    tag = secrets.token_hex(3)
    netns, link = f"sxwl-art-{tag}", f"sxa{tag}"
    octet = int(tag[:2], 16) % 250 + 1
    host_ip, inner_ip = f"10.254.{octet}.1", f"10.254.{octet}.2"

    def ip(*args: str, inside: bool = False) -> None:
        subprocess.run(["ip", *(["-n", netns] if inside else []), *args], check=True, capture_output=True)

    ip("netns", "add", netns)
    try:
        ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", netns)
        ip("addr", "add", f"{host_ip}/30", "dev", link)
        ip("link", "set", link, "up")
        ip("link", "set", "lo", "up", inside=True)
        ip("addr", "add", f"{inner_ip}/30", "dev", "eth0", inside=True)
        ip("link", "set", "eth0", "up", inside=True)
        yield netns, host_ip
    finally:
        subprocess.run(["ip", "link", "delete", link], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "delete", netns], check=False, capture_output=True)


def inside(netns: str, cwd: Path, home: Path, *command: str) -> subprocess.CompletedProcess[str]:
    """A command in the namespace with a bare environment (no venv, no PYTHON* variables)."""
    env = ["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", f"HOME={home}", "NO_COLOR=1", "COLUMNS=200"]
    return subprocess.run(
        ["ip", "netns", "exec", netns, *env, *command],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.skipif(not Path(SYSTEM_PYTHON).exists(), reason="needs the system's python3")
def test_download_verify_and_deploy_from_the_cloud_with_no_route_out(
    tmp_path: Path, offline: tuple[str, str], ssh_key: Path, make_hosts: MakeHosts
) -> None:
    netns, host_ip = offline
    root = make_artifact(tmp_path / "build" / "artifact")
    zipapp.build(root / "3kctl")
    write_checksums(root)
    built = tmp_path / "3k-artifact.tgz"
    tar_gz(root, built, "artifact")
    port = free_port()
    # The operator names the cloud's URL: the artifact it serves carries it, so no --cloud is needed.
    settings = {"SXWL_ARTIFACT_FILE": str(built), "SXWL_PUBLIC_URL": f"http://{host_ip}:{port}"}
    cloud = CloudProcess(tmp_path / "cloud", port, env=settings, host=host_ip)
    try:
        key = provider_key(cloud)
        opt, home = tmp_path / "opt", tmp_path / "home"
        opt.mkdir()
        home.mkdir()
        routes = inside(netns, opt, home, "ip", "route").stdout
        assert "default" not in routes  # nothing but the link to the cloud
        out = inside(netns, opt, home, "wget", "-q", "-T", "3", "-t", "1", "https://proxy.golang.org/")
        assert out.returncode != 0
        got = inside(netns, opt, home, "wget", "-q", f"{cloud.url}/downloads/3k-artifact.tgz")
        assert got.returncode == 0, got.stderr
        sums = inside(
            netns, opt, home, "wget", "-q", "-O", "sums", f"{cloud.url}/downloads/3k-artifact.tgz.sha256"
        )
        assert sums.returncode == 0
        assert inside(netns, opt, home, "sha256sum", "-c", "sums").returncode == 0
        assert inside(netns, opt, home, "tar", "xf", "3k-artifact.tgz").returncode == 0
        artifact = opt / "artifact"
        verified = inside(netns, artifact, home, "./3kctl", "artifact", "verify")
        assert verified.returncode == 0, verified.stdout + verified.stderr
        assert "artifact 0.1.0 OK — 11 files match manifest.yaml" in verified.stdout
        config = artifact / "conf" / "config-sample.conf"
        config.parent.mkdir(exist_ok=True)  # the stand-in artifact has no sample
        config.write_text(SAMPLE_CONFIG.replace("/root/.ssh/id_rsa", str(ssh_key)))
        deployed = inside(
            netns, artifact, home, "./3kctl", "deploy", "all", f"--access-key={key}", "--dry-run",
            "-f", str(config),
        )  # fmt: skip
        assert f"accessKey accepted by {cloud.url}" in deployed.stdout, deployed.stdout + deployed.stderr

        hosts = make_hosts(["master1", "worker1"])
        name = f"cpod-{secrets.token_hex(3)}"
        config.write_text(f"name: {name}\n" + config_text(hosts, ssh_key))
        records = tmp_path / "records"
        agent = AgentProcess(
            cloud.url, tmp_path / "agent", key, "--name", name, "--heartbeat-interval", "0.2"
        )
        try:
            env = {
                "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME": str(home),
                "NO_COLOR": "1",
                "SXWL_3KCTL_FAKE_KK": str(records / "kk"),
                "SXWL_3KCTL_FAKE_KUBE": str(records / "kube"),
                "SXWL_3KCTL_POLL_INTERVAL": "0.2",
            }
            run = subprocess.run(
                ["./3kctl", "deploy", "all", f"--access-key={key}", "-f", str(config), "--wait-timeout",
                 "90"],
                cwd=artifact, env=env, capture_output=True, text=True, timeout=300, check=False,
            )  # fmt: skip
        finally:
            agent.stop()
        assert run.returncode == 0, run.stdout + run.stderr
        assert f"accessKey accepted by {cloud.url}" in run.stdout and "CPod deployed." in run.stdout
        check = httpx.get(
            f"{cloud.url}/api/v1/agent/access-key/check", headers={"Authorization": f"Bearer {key}"}
        ).json()
        assert [c["name"] for c in check["cpods"]] == [name]
    finally:
        cloud.stop()
