"""Which worker runs which test under pytest-xdist (``make test`` runs two): every test on the
Kubernetes control plane on one worker, each module with a module fixture on one worker, the rest
spread test by test.

The control plane and the real nodes are session fixtures, and the real nodes hold a host-wide lock
(tests/support/k8s_node.py), so the tests that use them must share one worker. xdist's own
``--dist loadgroup`` cannot group them here: it marks a group by rewriting ``item._nodeid``, which
pytest 9 no longer reads. The controller sees only node ids, so the group is named by path, and
tests/conftest.py refuses a collection where a test outside these paths uses the cluster."""

from __future__ import annotations

import re

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling

KUBERNETES_GROUP = "kubernetes"
KUBERNETES_PATHS = ("tests/k8s/", "tests/ctl/test_deploy_k8s.py::")


def on_kubernetes(nodeid: str) -> bool:
    return nodeid.startswith(KUBERNETES_PATHS)


# A module whose tests share a fixture it builds once (a cloud, an agent, a browser's world).
SHARED_FIXTURE = re.compile(r"""scope=["'](module|class)["']""")


class KubernetesTogether(LoadScopeScheduling):
    """The Kubernetes tests together; the tests of a module that shares a module fixture together too,
    so that its fixture is built on one worker only (spread test by test, both workers built it);
    every other test on its own, to spread the load evenly."""

    def __init__(self, config: pytest.Config, log: Producer | None = None) -> None:
        super().__init__(config, log)
        self._root = config.rootpath
        self._shares: dict[str, bool] = {}

    def _split_scope(self, nodeid: str) -> str:
        if on_kubernetes(nodeid):
            return KUBERNETES_GROUP
        module = nodeid.split("::", 1)[0]
        return module if self._shares_fixture(module) else nodeid

    def _shares_fixture(self, module: str) -> bool:
        if module not in self._shares:
            path = self._root / module
            self._shares[module] = path.is_file() and bool(SHARED_FIXTURE.search(path.read_text()))
        return self._shares[module]
