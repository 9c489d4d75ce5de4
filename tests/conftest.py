from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from playwright.sync_api import Browser, Playwright, sync_playwright
from xdist.remote import Producer

from sxwl.cloud.app import create_app
from sxwl.cloud.config import Settings
from tests.support import schema_templates, shared_tls
from tests.support.browser import launch
from tests.support.clock import TestClock
from tests.support.cloud import test_settings
from tests.support.k8s import K8sCluster, MissingBinariesError, StartError, bin_dir
from tests.support.k8s_images import MissingImagesError
from tests.support.k8s_node import RealNodes
from tests.support.postgres import TempPostgres
from tests.support.seaweedfs import SeaweedFS
from tests.support.worker_groups import KubernetesTogether, on_kubernetes

shared_tls.install()


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> KubernetesTogether:
    return KubernetesTogether(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests on the Kubernetes control plane run first, and under pytest-xdist all on one
    worker (tests/support/worker_groups.py): the control plane and the real nodes start once, and
    the longest group of the suite starts at once while the other worker takes the rest."""
    outside = [
        item.nodeid
        for item in items
        if "k8s_cluster" in getattr(item, "fixturenames", ()) and not on_kubernetes(item.nodeid)
    ]
    if outside:
        raise pytest.UsageError(
            "these tests use k8s_cluster outside tests/support/worker_groups.py's KUBERNETES_PATHS, "
            "so two workers would start it: " + ", ".join(outside)
        )
    items.sort(key=lambda item: not on_kubernetes(item.nodeid))  # stable: in collection order


# How to stop what the Kubernetes tests started, the last started first: run as soon as the last of
# them on this worker has ended, not at the session's end. Left running, the control plane and the
# real nodes (containerd, kubelets, etcd, the API server) took CPU from every later test.
_KUBERNETES_STOPS: list[Callable[[], None]] = []


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if on_kubernetes(item.nodeid) and (nextitem is None or not on_kubernetes(nextitem.nodeid)):
        while _KUBERNETES_STOPS:
            _KUBERNETES_STOPS.pop()()


@pytest.fixture(scope="session")
def postgres() -> Iterator[TempPostgres]:
    cluster = TempPostgres().start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def real_nodes(k8s_cluster: K8sCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNodes]:
    """Real worker nodes (kubelet + containerd + runc + CNI, CoreDNS) joined to `k8s_cluster`, with the
    test images imported (tests/support/k8s_node.py). Fails (never skips) when a binary, an image or a
    host tool is missing; at the end fails if the host is not as it was before they started."""
    nodes: RealNodes | None = None
    failure = ""
    try:
        nodes = RealNodes(k8s_cluster, tmp_path_factory.mktemp("real-nodes")).start()
    except (StartError, MissingImagesError) as error:
        failure = str(error)
    if nodes is None:
        pytest.fail(failure, pytrace=False)

    def stop() -> None:
        assert nodes is not None
        nodes.stop()
        # The nodes' image stores are ~17 GB a session; pytest keeps three sessions' temp dirs.
        shutil.rmtree(nodes.root, ignore_errors=True)

    _KUBERNETES_STOPS.append(stop)
    yield nodes
    stop()  # nothing left to do if the last Kubernetes test did it
    if nodes.host_differences:
        pytest.fail(
            "the real nodes left the host changed:\n" + "\n".join(nodes.host_differences), pytrace=False
        )


@pytest.fixture(scope="session")
def k8s_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[K8sCluster]:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK on loopback
    (tests/support/k8s.py), for the whole session: used by tests/k8s and by 3kctl's end-to-end test
    (tests/ctl/test_deploy_k8s.py). Fails (never skips) when `make k8s-bins` has not built the binaries."""
    cluster: K8sCluster | None = None
    failure = ""
    try:
        cluster = K8sCluster(root=tmp_path_factory.mktemp("k8s"), bins=bin_dir()).start()
    except (MissingBinariesError, StartError) as error:
        failure = str(error)  # failed outside the except block: no chained traceback in the report
    if cluster is None:
        pytest.fail(failure, pytrace=False)
    _KUBERNETES_STOPS.append(cluster.stop)
    yield cluster
    cluster.stop()


@pytest.fixture
def clock() -> Iterator[TestClock]:
    """The cloud's clock frozen at a fixed instant for this test; the test moves it. Request it
    before the client, so the app's loops start on the frozen clock."""
    frozen = TestClock()
    yield frozen
    frozen.release()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sxwl.db'}"
    cluster: TempPostgres = request.getfixturevalue("postgres")
    return cluster.create_database()


MakeSettings = Callable[..., Settings]


@pytest.fixture
def make_settings(tmp_path: Path, db_url: str) -> MakeSettings:
    def make(**overrides: Any) -> Settings:
        return test_settings(tmp_path / "data", db_url, **overrides)

    return make


@pytest.fixture
def make_client(make_settings: MakeSettings) -> Iterator[Callable[..., TestClient]]:
    clients: list[TestClient] = []

    def make(**overrides: Any) -> TestClient:
        settings = make_settings(**overrides)
        schema_templates.at_head(settings.resolved_database_url())
        client = TestClient(create_app(settings))
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


def register(
    client: TestClient, email: str, role: str = "provider", password: str = "correct horse", **extra: Any
) -> dict[str, Any]:
    response = client.post(
        "/api/v1/auth/register", json={"email": email, "password": password, "role": role, **extra}
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def login(client: TestClient, email: str, password: str = "correct horse") -> dict[str, str]:
    response = client.post("/api/v1/auth/login", json={"email": email, "password": password})
    assert response.status_code == 200, response.text
    return {"Authorization": f"Bearer {response.json()['access_token']}"}


@pytest.fixture(scope="session")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="session")
def browser(playwright: Playwright) -> Iterator[Browser]:
    """One headless Debian Chromium for every browser test; each test opens its own context."""
    browser = launch(playwright)
    try:
        yield browser
    finally:
        browser.close()


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """One S3-compatible server (SeaweedFS, tests/support/seaweedfs.py) for the session's tests."""
    server = SeaweedFS(tmp_path_factory.mktemp("seaweedfs"))
    server.start_first()
    try:
        yield server
    finally:
        server.stop()
