"""The agent as the offline artifact delivers it, on a real node that reaches no registry
(docs/artifact.md, "End to end"). The artifact's agent chart and image archive are made by the build's
own code (sxwl.artifactbuild: `helm package` of deploy/helm/sxwl-agent, the OCI archive of the agent's
image); its other files are stand-ins, as in tests/ctl/test_artifact_e2e.py, which covers them. The
cloud serves it, the test downloads, checks and unpacks it, imports images/sxwl-agent-0.1.0.oci.tar
into the real node's containerd under the name the manifest's chart values give (what the private
registry would hold), and installs charts/sxwl-agent-0.1.0.tgz with helm and 3kctl's values. The
Deployment's pod runs the agent from that image on the node, in-cluster (its ServiceAccount through the
`kubernetes` Service: tests/support/k8s_api_for_pods.py); the CPod comes online, and a user's job runs
on the node, its artifact brought up by the pod's uploader, which is the agent's image too."""

from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from sxwl.artifactbuild import charts, image
from sxwl.artifactbuild.pack import tar_gz
from sxwl.artifactbuild.parts import Missing
from sxwl.ctl.artifact import load_manifest, write_checksums
from tests.ctl.conftest import make_artifact
from tests.support.agent import eventually
from tests.support.cloud import CloudProcess
from tests.support.k8s import REPO, K8sCluster
from tests.support.k8s_api_for_pods import api_for_pods
from tests.support.k8s_images import PYTHON_IMAGE, archive_image
from tests.support.k8s_node import RealNodes
from tests.support.k8s_node_config import REAL_LABEL, REAL_TAINT
from tests.support.net import free_port

pytestmark = pytest.mark.k8s

T = TypeVar("T")
NODE = "real-0"  # the image goes to this node only: one import is enough


def build(cluster: K8sCluster, root: Path) -> Path:
    """3k-artifact.tgz whose agent chart and image the build made, the rest stand-ins."""
    artifact = make_artifact(root / "artifact")
    data = yaml.safe_load((artifact / "manifest.yaml").read_text())
    [chart] = [c for c in data["charts"] if c["name"] == "sxwl-agent"]
    packaged = charts.agent_chart(REPO, cluster.bins / "helm", str(chart["version"]), artifact, chart["path"])
    assert not isinstance(packaged, Missing), packaged
    [archive] = data["imageArchives"]
    made = image.agent_archive(REPO, archive["image"], artifact, archive["path"], "amd64")
    assert not isinstance(made, Missing), made
    archive["digest"] = made[1]
    data["checksums"] = {}
    (artifact / "manifest.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    write_checksums(artifact)
    output = root / "3k-artifact.tgz"
    tar_gz(artifact, output, "artifact")
    return output


def download(url: str, into: Path) -> Path:
    """wget's part: the archive, checked against the cloud's .sha256, unpacked."""
    into.mkdir()
    target = into / "3k-artifact.tgz"
    digest = hashlib.sha256()
    with (
        httpx.stream("GET", f"{url}/downloads/3k-artifact.tgz", timeout=120) as response,
        target.open("wb") as out,
    ):
        assert response.status_code == 200, response.read()
        for chunk in response.iter_bytes():
            digest.update(chunk)
            out.write(chunk)
    assert httpx.get(f"{url}/downloads/3k-artifact.tgz.sha256").text.split()[0] == digest.hexdigest()
    with tarfile.open(target) as tar:
        tar.extractall(into, filter="data")
    return into / "artifact"


def account(url: str, role: str) -> dict[str, str]:
    credentials = {"email": f"{role}-{secrets.token_hex(3)}@example.com", "password": "correct horse"}
    httpx.post(f"{url}/api/v1/auth/register", json={**credentials, "role": role}).raise_for_status()
    token = httpx.post(f"{url}/api/v1/auth/login", json=credentials).json()["access_token"]
    return {"Authorization": f"Bearer {token}"}


def values(chart_values: dict[str, Any], registry: str, cloud: str, name: str) -> dict[str, Any]:
    """3kctl's values for the chart (the manifest's, `{registry}` filled in; its --set-string ones),
    and what the provider adds to keep the agent and the tenant pods on the real node."""
    on_node = {REAL_LABEL[0]: REAL_LABEL[1], "kubernetes.io/hostname": NODE}
    taint = f"{REAL_TAINT['key']}={REAL_TAINT['value']}:{REAL_TAINT['effect']}"
    manifest_values: dict[str, Any] = json.loads(json.dumps(chart_values).replace("{registry}", registry))
    return {
        **manifest_values,
        "cloud": {"url": cloud},
        "existingSecret": "sxwl-agent",
        "cpod": {"name": name},
        "heartbeatIntervalSeconds": 1,
        "nodeSelector": on_node,
        "tolerations": [{**REAL_TAINT, "operator": "Equal"}],
        "jobs": {"podNodeSelector": on_node, "podTolerations": [taint]},
    }


def waited(check: Callable[[], T | None], timeout: float, what: str, diagnose: Callable[[], str]) -> T:
    """eventually(), and on a timeout what ``diagnose`` then says (the pods, their events and logs)."""
    try:
        return eventually(check, timeout=timeout, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnose()}") from None


def test_the_artifacts_agent_chart_and_image_run_a_job_on_a_real_node_with_no_registry(
    k8s_cluster: K8sCluster, real_nodes: RealNodes, tmp_path: Path
) -> None:
    cluster = k8s_cluster
    built = build(cluster, tmp_path / "build")
    host = real_nodes.host_address
    port = free_port(host)
    url = f"http://{host}:{port}"
    cloud = CloudProcess(
        tmp_path / "cloud",
        port,
        host=host,
        env={
            "SXWL_DATABASE_URL": f"sqlite:///{tmp_path / 'sxwl.db'}",
            "SXWL_ARTIFACT_FILE": str(built),
            "SXWL_PUBLIC_URL": url,
            "SXWL_HEARTBEAT_INTERVAL_MIN_S": "0.1",
            "SXWL_LIVENESS_CHECK_S": "0.2",
        },
    )
    namespace = f"sxwl-art-{secrets.token_hex(3)}"
    name = f"cpod-{secrets.token_hex(3)}"
    user_ns = ""
    try:
        artifact = download(url, tmp_path / "opt")
        verified = subprocess.run(
            [sys.executable, "-m", "sxwl.ctl", "artifact", "verify", str(artifact)],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        assert verified.returncode == 0, verified.stdout + verified.stderr
        manifest = load_manifest(artifact)
        assert manifest.cloud == url
        chart = manifest.chart("sxwl-agent")
        agent_image = f"{manifest.registry_prefix}/sxwl-agent:{chart.values['image']['tag']}"

        # No registry: the node gets the image from the artifact's archive, under the chart's name.
        [archive] = manifest.image_archives
        # A plain `ctr images import` names it as the CRI looks it up (sxwl/… is docker.io/sxwl/…).
        assert archive_image(artifact / archive.path) == (f"docker.io/{archive.image}", archive.digest)
        digest = real_nodes.import_archive(artifact / archive.path, agent_image, NODE)
        assert digest == archive.digest

        provider = account(url, "provider")
        key = httpx.get(f"{url}/api/v1/me/access-key", headers=provider).json()["access_key"]
        cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        cluster.apply({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "sxwl-agent", "namespace": namespace},
            "stringData": {"SXWL_API_URL": url, "SXWL_ACCESS_KEY": key},
        })  # fmt: skip
        chosen = tmp_path / "values.yaml"
        chosen.write_text(yaml.safe_dump(values(chart.values, manifest.registry_prefix, url, name)))
        with api_for_pods(cluster):
            cluster.helm(
                "install", chart.release, str(artifact / chart.path), "-n", namespace, "-f", str(chosen),
            )  # fmt: skip

            def described() -> str:
                return cluster.kubectl("describe", "pods", "-n", namespace, check=False) + cluster.kubectl(
                    "logs", "-n", namespace, "deployment/sxwl-agent", "--tail=60", check=False
                )

            def running() -> dict[str, Any] | None:
                items = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-o", "json"))["items"]
                ready = [
                    p for p in items
                    if any(c.get("ready") for c in p.get("status", {}).get("containerStatuses", []))
                ]  # fmt: skip
                return ready[0] if ready else None

            pod = waited(running, 120, "the agent's pod ready", described)
            pod_name = pod["metadata"]["name"]
            assert pod["spec"]["nodeName"] == NODE
            assert pod["spec"]["containers"][0]["image"] == agent_image
            events = cluster.kubectl(
                "get", "events", "-n", namespace, f"--field-selector=involvedObject.name={pod_name}",
                "-o", "jsonpath={range .items[*]}{.reason}: {.message}{'\\n'}{end}",
            )  # fmt: skip
            assert f'Container image "{agent_image}" already present on machine' in events, events
            assert "Pulling" not in events, events

            def online() -> dict[str, Any] | None:
                cpods = httpx.get(f"{url}/api/v1/cpods", headers=provider).json()
                found = [c for c in cpods if c["name"] == name and c["status"] == "online"]
                return found[0] if found else None

            cpod = waited(online, 90, "the CPod online", described)
            assert cpod["runtime"] == "kubernetes"
            assert NODE in {n["name"] for n in cpod["nodes"]}

            user = account(url, "user")
            user_ns = "sxwl-tenant-" + httpx.get(f"{url}/api/v1/me", headers=user).json()["id"]
            command = (
                "echo hello from the agent of the artifact on $(hostname); "
                'python3 -c "import sys; print(sys.version_info[:2])" > "$SXWL_OUTPUT_DIR/python.txt"'
            )
            body = {"name": "from-artifact", "command": command, "image": PYTHON_IMAGE, "gpus_per_node": 0}
            submitted = httpx.post(f"{url}/api/v1/jobs", headers=user, json=body)
            assert submitted.status_code == 201, submitted.text
            job_id = submitted.json()["id"]

            def ended() -> dict[str, Any] | None:
                job: dict[str, Any] = httpx.get(f"{url}/api/v1/jobs/{job_id}", headers=user).json()
                return job if job["state"] in ("succeeded", "failed", "cancelled") else None

            job = waited(ended, 180, "the job to end", described)
            log = httpx.get(f"{url}/api/v1/jobs/{job_id}/logs", headers=user).text
            assert job["state"] == "succeeded", f"{job}\n{log}\n{described()}"
            assert "[rank 0] hello from the agent of the artifact on " in log, log
            listed = httpx.get(f"{url}/api/v1/jobs/{job_id}/artifacts", headers=user).json()
            assert [a["path"] for a in listed] == ["python.txt"]
            got = httpx.get(f"{url}/api/v1/jobs/{job_id}/artifacts/python.txt", headers=user)
            assert got.text == "(3, 11)\n"
            # The tenant pod's uploader was the agent's image (the chart's default), which only the
            # node holds: the artifact came up from there.
            deployment = cluster.get("deployment", "sxwl-agent", namespace)
            [container] = deployment["spec"]["template"]["spec"]["containers"]
            assert f"--uploader-image={agent_image}" in container["args"]
    finally:
        cluster.helm("uninstall", "sxwl-agent", "-n", namespace, "--wait", check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found", check=False)
        if user_ns:
            cluster.kubectl("delete", "namespace", user_ns, "--wait=false", "--ignore-not-found", check=False)
        cloud.stop()
