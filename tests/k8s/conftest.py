"""Fixtures for tests against the real Kubernetes control plane (tests/support/k8s.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.k8s import K8sCluster, MissingBinariesError, StartError, bin_dir


@pytest.fixture(scope="session")
def k8s_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[K8sCluster]:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK on loopback, for the
    whole session. Fails (never skips) when `make k8s-bins` has not built the binaries."""
    cluster: K8sCluster | None = None
    failure = ""
    try:
        cluster = K8sCluster(root=tmp_path_factory.mktemp("k8s"), bins=bin_dir()).start()
    except (MissingBinariesError, StartError) as error:
        failure = str(error)  # failed outside the except block: no chained traceback in the report
    if cluster is None:
        pytest.fail(failure, pytrace=False)
    yield cluster
    cluster.stop()
