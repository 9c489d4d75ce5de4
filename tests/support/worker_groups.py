"""Which worker runs which test under pytest-xdist (``make test`` runs two): every test on the
Kubernetes control plane on one worker, the rest spread test by test.

The control plane and the real nodes are session fixtures, and the real nodes hold a host-wide lock
(tests/support/k8s_node.py), so the tests that use them must share one worker. xdist's own
``--dist loadgroup`` cannot group them here: it marks a group by rewriting ``item._nodeid``, which
pytest 9 no longer reads. The controller sees only node ids, so the group is named by path, and
tests/conftest.py refuses a collection where a test outside these paths uses the cluster."""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

KUBERNETES_GROUP = "kubernetes"
KUBERNETES_PATHS = ("tests/k8s/", "tests/ctl/test_deploy_k8s.py::")


def on_kubernetes(nodeid: str) -> bool:
    return nodeid.startswith(KUBERNETES_PATHS)


class KubernetesTogether(LoadScopeScheduling):
    def _split_scope(self, nodeid: str) -> str:
        return KUBERNETES_GROUP if on_kubernetes(nodeid) else nodeid
