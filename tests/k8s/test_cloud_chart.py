"""The cloud's Helm chart deploy/helm/sxwl-cloud (docs/helm-cloud.md): linted, rendered and checked
(non-root, no service-account token, probes, PodDisruptionBudget, Secrets by reference, resources, N
replicas), and installed with two replicas that really run on the real test nodes
(tests/support/k8s_node.py) on one PostgreSQL: both become Ready through /readyz against that database,
an account made on one replica logs in on the other, and with the database halted both leave
readiness without a restart and come back."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml
from psycopg import sql

from tests.support.cloud_image import cloud_image
from tests.support.k8s import REPO, K8sCluster
from tests.support.k8s_node import RealNodes
from tests.support.postgres import TempPostgres

pytestmark = pytest.mark.k8s

CHART = REPO / "deploy" / "helm" / "sxwl-cloud"
RELEASE = "sxwl-cloud"  # holds the chart's name: the objects are called sxwl-cloud
SELECTOR = f"app.kubernetes.io/name=sxwl-cloud,app.kubernetes.io/instance={RELEASE}"
DB_PASSWORD = f"pw-{uuid.uuid4().hex}"
SECRET_KEY = f"key-{uuid.uuid4().hex}"
CHART_SECRETS = (
    f"--set=databaseUrl=postgresql://sxwl:{DB_PASSWORD}@db.example:5432/sxwl",
    f"--set=secretKey={SECRET_KEY}",
)

INGRESS = ("--set=ingress.enabled=true", "--set=ingress.hosts[0].host=cloud.example.com")
S3 = ("--set=s3.existingSecret=store",)


def render(cluster: K8sCluster, *values: str) -> dict[str, dict[str, Any]]:
    """`helm template` of the chart: `{"Kind/name": object}`."""
    text = cluster.helm("template", RELEASE, str(CHART), "-n", "sxwl", *values)
    return {f"{doc['kind']}/{doc['metadata']['name']}": doc for doc in yaml.safe_load_all(text) if doc}


def refusal(cluster: K8sCluster, *values: str) -> str:
    """What helm says when a `helm template` that must fail does (not the command line it echoes)."""
    with pytest.raises(RuntimeError) as failed:
        cluster.helm("template", RELEASE, str(CHART), *values)
    return str(failed.value).split(" failed (", 1)[1]


def test_chart_lints(k8s_cluster: K8sCluster) -> None:
    lint = k8s_cluster.helm("lint", "--strict", str(CHART), *CHART_SECRETS)
    assert "0 chart(s) failed" in lint, lint
    lint = k8s_cluster.helm("lint", "--strict", str(CHART), "--set=existingSecret=cloud", *INGRESS, *S3)
    assert "0 chart(s) failed" in lint, lint


def test_rendered_replicas_are_non_root_probed_budgeted_and_read_secrets_by_reference(
    k8s_cluster: K8sCluster,
) -> None:
    objects = render(k8s_cluster, *CHART_SECRETS, "--set=replicas=3", "--set=s3.env.SXWL_S3_BUCKET=ckpt")
    assert set(objects) == {
        f"Deployment/{RELEASE}",
        f"Service/{RELEASE}",
        f"PodDisruptionBudget/{RELEASE}",
        f"Secret/{RELEASE}",
        f"Secret/{RELEASE}-s3",
    }
    deployment = objects[f"Deployment/{RELEASE}"]
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    (container,) = pod["containers"]
    assert container["command"][:4] == ["sxwl", "serve", "--host", "0.0.0.0"]  # noqa: S104 - comparing
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/tmp", "/var/lib/sxwl"} <= mounts
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]

    env = {e["name"]: e for e in container["env"]}
    for name in ("SXWL_DATABASE_URL", "SXWL_SECRET_KEY"):
        assert "value" not in env[name]
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": RELEASE, "key": name}
    assert container["envFrom"] == [{"secretRef": {"name": f"{RELEASE}-s3"}}]
    # No secret is written into the pod spec, however it is encoded.
    assert DB_PASSWORD not in json.dumps(deployment) and SECRET_KEY not in json.dumps(deployment)
    assert objects[f"PodDisruptionBudget/{RELEASE}"]["spec"]["maxUnavailable"] == 1
    assert objects[f"PodDisruptionBudget/{RELEASE}"]["spec"]["selector"] == deployment["spec"]["selector"]

    named = render(k8s_cluster, "--set=existingSecret=cloud", *INGRESS)
    assert not [key for key in named if key.startswith("Secret/")], "an existing Secret is used, not created"
    env = {
        e["name"]: e
        for e in named[f"Deployment/{RELEASE}"]["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["SXWL_SECRET_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "cloud"
    rule = named[f"Ingress/{RELEASE}"]["spec"]["rules"][0]
    assert rule["host"] == "cloud.example.com"
    assert rule["http"]["paths"][0]["backend"]["service"] == {"name": RELEASE, "port": {"name": "http"}}


def test_values_that_would_break_the_cloud_are_refused(k8s_cluster: K8sCluster) -> None:
    assert "set existingSecret" in refusal(k8s_cluster)
    assert "give a postgresql:// URL" in refusal(
        k8s_cluster, "--set=databaseUrl=sqlite:////tmp/sxwl.db", "--set=secretKey=k"
    )
    assert "settings.SXWL_SECRET_KEY: a secret" in refusal(
        k8s_cluster, "--set=existingSecret=cloud", "--set=settings.SXWL_SECRET_KEY=k"
    )
    assert "settings.PUBLIC_URL: the cloud's settings are named SXWL_*" in refusal(
        k8s_cluster, "--set=existingSecret=cloud", "--set=settings.PUBLIC_URL=x"
    )
    assert "ingress.hosts: give at least one host" in refusal(
        k8s_cluster, "--set=existingSecret=cloud", "--set=ingress.enabled=true"
    )


# ---- installed on the real nodes ----------------------------------------------------------------


@dataclass
class Database:
    server: TempPostgres
    url: str  # as pods reach it


@pytest.fixture
def database(real_nodes: RealNodes) -> Iterator[Database]:
    """A PostgreSQL that pods reach on the host's address, with a password login."""
    server = TempPostgres(host=real_nodes.host_address, clients=real_nodes.pod_subnets).start()
    try:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE ROLE sxwl LOGIN PASSWORD {}").format(sql.Literal(DB_PASSWORD)))
            conn.execute("CREATE DATABASE sxwl OWNER sxwl")
        yield Database(
            server, f"postgresql://sxwl:{DB_PASSWORD}@{real_nodes.host_address}:{server.port}/sxwl"
        )
    finally:
        server.stop()


def pods(cluster: K8sCluster, ns: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(
        cluster.kubectl("get", "pods", "-n", ns, "-l", SELECTOR, "-o", "json")
    )["items"]
    return items


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def restarts(found: list[dict[str, Any]]) -> int:
    return sum(c["restartCount"] for p in found for c in p["status"].get("containerStatuses", []))


def wait_pods(
    cluster: K8sCluster, ns: str, check: Callable[[list[dict[str, Any]]], bool], timeout: float, what: str
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = pods(cluster, ns)
        if check(found):
            return found
        time.sleep(0.5)
    described = cluster.kubectl("describe", "pods", "-n", ns, "-l", SELECTOR, check=False)
    logs = cluster.kubectl("logs", "-n", ns, "-l", SELECTOR, "--tail=40", "--prefix", check=False)
    raise AssertionError(f"{what} within {timeout} s:\n{described[-6000:]}\n{logs[-4000:]}")


def both_ready(found: list[dict[str, Any]]) -> bool:
    return len(found) == 2 and all(ready(p) for p in found)


def account(role: str) -> dict[str, str]:
    return {"email": f"{role}-{uuid.uuid4().hex[:6]}@example.com", "password": "correct horse"}


def test_replicas_run_on_the_real_nodes_and_share_one_database(
    k8s_cluster: K8sCluster, real_nodes: RealNodes, database: Database, tmp_path: Path
) -> None:
    started = time.monotonic()
    image = cloud_image(real_nodes, tmp_path)
    built = time.monotonic()
    repository, tag = image.rsplit(":", 1)
    ns = f"sxwl-cloud-{uuid.uuid4().hex[:6]}"
    k8s_cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    k8s_cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "cloud", "namespace": ns},
            "stringData": {"SXWL_DATABASE_URL": database.url, "SXWL_SECRET_KEY": SECRET_KEY},
        }
    )
    try:
        values = tmp_path / "values.yaml"
        values.write_text(
            yaml.safe_dump(
                {
                    **RealNodes.pod_placement(),  # the chart's nodeSelector and tolerations
                    "existingSecret": "cloud",
                    "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
                    "topologySpread": {"whenUnsatisfiable": "DoNotSchedule"},
                    "probes": {"readiness": {"periodSeconds": 1, "failureThreshold": 1}},
                    "resources": {
                        "requests": {"cpu": "50m", "memory": "64Mi"},
                        "limits": {"memory": "512Mi"},
                    },
                }
            )
        )
        k8s_cluster.helm("install", RELEASE, str(CHART), "-n", ns, "-f", str(values))
        # Ready is /readyz answering 200: each replica's database answers at the schema's head.
        running = wait_pods(k8s_cluster, ns, both_ready, 180, "2 Ready replicas")
        came_up = time.monotonic()
        assert {p["spec"]["nodeName"] for p in running} == set(real_nodes.names), "one replica per node"
        for pod in running:
            assert "serviceAccountToken" not in json.dumps(pod["spec"]["volumes"])
        first, second = (f"http://{p['status']['podIP']}:8000" for p in running)
        for base in (first, second):
            assert httpx.get(f"{base}/readyz", timeout=10).json()["status"] == "ready"

        # An account registered on one replica logs in on the other: one database.
        credentials = account("provider")
        made = httpx.post(
            f"{first}/api/v1/auth/register", json={**credentials, "role": "provider"}, timeout=30
        )
        assert made.status_code == 201, made.text
        login = httpx.post(f"{second}/api/v1/auth/login", json=credentials, timeout=30)
        assert login.status_code == 200, login.text
        headers = {"Authorization": f"Bearer {login.json()['access_token']}"}
        # The accessKey is kept encrypted with SXWL_SECRET_KEY: both replicas read it the same.
        keys = [
            httpx.get(f"{base}/api/v1/me/access-key", headers=headers, timeout=30).json()["access_key"]
            for base in (first, second)
        ]
        assert keys[0] == keys[1] and keys[0]
        with psycopg.connect(database.server.url("sxwl")) as conn:
            assert conn.execute("SELECT count(*) FROM users").fetchone() == (1,)

        # The database gone, both replicas leave the Service (readiness) and none is restarted
        # (liveness does not touch the database); back, both are Ready again by themselves.
        before = restarts(running)
        database.server.halt()
        wait_pods(k8s_cluster, ns, lambda found: not any(ready(p) for p in found), 60, "both NotReady")
        answer = httpx.get(f"{first}/readyz", timeout=10)
        assert answer.status_code == 503
        assert answer.json()["error"]["details"] == {"database": "unreachable", "schema": "unknown"}
        database.server.resume()
        running = wait_pods(k8s_cluster, ns, both_ready, 60, "both Ready again")
        assert restarts(running) == before
        assert httpx.post(f"{second}/api/v1/auth/login", json=credentials, timeout=30).status_code == 200
        deployed = k8s_cluster.kubectl("get", "deployment", RELEASE, "-n", ns, "-o", "json")
        assert DB_PASSWORD not in deployed and SECRET_KEY not in deployed
    finally:
        k8s_cluster.helm("uninstall", RELEASE, "-n", ns, "--wait", check=False)
    deadline = time.monotonic() + 60
    while pods(k8s_cluster, ns) and time.monotonic() < deadline:
        time.sleep(1)
    assert not pods(k8s_cluster, ns), "the replicas are gone after the uninstall"
    k8s_cluster.kubectl("delete", "namespace", ns, "--wait=false")
    print(
        f"cloud chart on the real nodes: image {built - started:.0f} s, Ready {came_up - built:.0f} s "
        f"(restarts {before}), all {time.monotonic() - started:.0f} s"
    )
