"""``3kctl deploy install ceph``: Rook-Ceph operator and a CephCluster from the artifact's charts,
OSDs on the configured devices (or every empty device, after confirmation), HEALTH_OK, then an RBD
StorageClass (the default) and a CephFS StorageClass."""

from __future__ import annotations

import json
import time
from typing import Any, TextIO

from sxwl.ctl.cluster import Host
from sxwl.ctl.ssh import run_sync
from sxwl.ctl.steps import Context, Step, StepFailed

NAMESPACE = "rook-ceph"
CLUSTER = "rook-ceph"
BLOCK_CLASS = "rook-ceph-block"
FS_CLASS = "rook-cephfs"
MIN_DEVICE_BYTES = 10 * 1024**3
LSBLK = "lsblk -J -b -o NAME,TYPE,SIZE,FSTYPE,MOUNTPOINT,RO"


def empty_devices(lsblk_json: str) -> list[tuple[str, int]]:
    """Whole disks with no partition, filesystem or mount, writable, of at least 10 GiB."""
    try:
        devices = json.loads(lsblk_json).get("blockdevices", [])
    except ValueError:
        return []
    found = []
    for dev in devices:
        if dev.get("type") != "disk" or dev.get("children") or dev.get("fstype") or dev.get("mountpoint"):
            continue
        if str(dev.get("ro")) in ("1", "True", "true"):
            continue
        size = int(dev.get("size") or 0)
        if size >= MIN_DEVICE_BYTES:
            found.append((str(dev["name"]), size))
    return found


def discover(ctx: Context, hosts: list[Host]) -> dict[str, list[tuple[str, int]]]:
    async def go() -> dict[str, list[tuple[str, int]]]:
        async with ctx.pool() as pool:
            results = await pool.run_all(hosts, LSBLK)
        found: dict[str, list[tuple[str, int]]] = {}
        for name, result in results.items():
            if not result.ok:
                raise StepFailed(f"cannot list the disks of {name}: {result.why()}")
            found[name] = empty_devices(result.stdout)
        return found

    return run_sync(go())


def osd_nodes(ctx: Context) -> dict[str, list[str]]:
    """Host → OSD devices: the config's devices on every worker, or what was discovered and confirmed."""
    chosen: dict[str, list[str]] | None = ctx.extra.get("ceph_nodes")
    if chosen is not None:
        return chosen
    return {h.name: list(ctx.config.ceph_devices) for h in ctx.config.workers}


def cluster_values(ctx: Context) -> dict[str, Any]:
    nodes = {name: devs for name, devs in osd_nodes(ctx).items() if devs}
    size = max(1, min(3, len(nodes)))
    return {
        "operatorNamespace": NAMESPACE,
        "toolbox": {"enabled": True},
        "cephClusterSpec": {
            "cephVersion": {"image": "{registry}/ceph:v18.2.4"},
            "dataDirHostPath": "/var/lib/rook",
            "mon": {"count": 3 if len(nodes) >= 3 else 1, "allowMultiplePerNode": False},
            "storage": {
                "useAllNodes": False,
                "useAllDevices": False,
                "nodes": [{"name": n, "devices": [{"name": d} for d in devs]} for n, devs in nodes.items()],
            },
        },
        "cephBlockPools": [
            {
                "name": "replicapool",
                "spec": {"failureDomain": "host", "replicated": {"size": size}},
                "storageClass": {"enabled": False},
            }
        ],
        "cephFileSystems": [
            {
                "name": "cephfs",
                "spec": {
                    "metadataPool": {"replicated": {"size": size}},
                    "dataPools": [{"name": "data0", "failureDomain": "host", "replicated": {"size": size}}],
                    "metadataServer": {"activeCount": 1, "activeStandby": True},
                },
                "storageClass": {"enabled": False},
            }
        ],
        "cephObjectStores": [],
    }


STORAGE_CLASSES = f"""\
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: {BLOCK_CLASS}
  annotations:
    storageclass.kubernetes.io/is-default-class: "true"
provisioner: rook-ceph.rbd.csi.ceph.com
parameters:
  clusterID: {NAMESPACE}
  pool: replicapool
  imageFormat: "2"
  imageFeatures: layering
  csi.storage.k8s.io/provisioner-secret-name: rook-csi-rbd-provisioner
  csi.storage.k8s.io/provisioner-secret-namespace: {NAMESPACE}
  csi.storage.k8s.io/controller-expand-secret-name: rook-csi-rbd-provisioner
  csi.storage.k8s.io/controller-expand-secret-namespace: {NAMESPACE}
  csi.storage.k8s.io/node-stage-secret-name: rook-csi-rbd-node
  csi.storage.k8s.io/node-stage-secret-namespace: {NAMESPACE}
  csi.storage.k8s.io/fstype: ext4
reclaimPolicy: Delete
allowVolumeExpansion: true
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: {FS_CLASS}
provisioner: rook-ceph.cephfs.csi.ceph.com
parameters:
  clusterID: {NAMESPACE}
  fsName: cephfs
  pool: cephfs-data0
  csi.storage.k8s.io/provisioner-secret-name: rook-csi-cephfs-provisioner
  csi.storage.k8s.io/provisioner-secret-namespace: {NAMESPACE}
  csi.storage.k8s.io/controller-expand-secret-name: rook-csi-cephfs-provisioner
  csi.storage.k8s.io/controller-expand-secret-namespace: {NAMESPACE}
  csi.storage.k8s.io/node-stage-secret-name: rook-csi-cephfs-node
  csi.storage.k8s.io/node-stage-secret-namespace: {NAMESPACE}
reclaimPolicy: Delete
allowVolumeExpansion: true
"""


def plan_values(ctx: Context) -> list[str]:
    chart = ctx.manifest.chart("rook-ceph-cluster")
    nodes = osd_nodes(ctx)
    if ctx.extra.get("discover_pending"):
        where = "every empty disk of the workers (listed with `lsblk`, confirmed before use)"
    else:
        where = "; ".join(f"{n}: {', '.join(d) or '-'}" for n, d in nodes.items())
    return [f"write {ctx.values_path(chart)} — OSDs on {where}"]


def run_values(ctx: Context, log: TextIO) -> None:
    nodes = {n: d for n, d in osd_nodes(ctx).items() if d}
    if not nodes:
        raise StepFailed(
            "no OSD device on any worker: name them in the config (`ceph: {devices: [sdb]}`) or "
            "attach empty disks"
        )
    chart = ctx.manifest.chart("rook-ceph-cluster")
    log.write(ctx.write_values(chart, cluster_values(ctx)).read_text())


def chart_step(name: str, release_chart: str, title: str) -> Step:
    def plan(ctx: Context) -> list[str]:
        chart = ctx.manifest.chart(release_chart)
        return [ctx.helm_install(chart).display()]

    def run(ctx: Context, log: TextIO) -> None:
        chart = ctx.manifest.chart(release_chart)
        if release_chart == "rook-ceph":
            ctx.write_values(chart)
        ctx.call(ctx.tools.kube, log, ctx.helm_install(chart), f"helm install {chart.release}")

    return Step(name, title, plan, run)


def health_command(ctx: Context) -> list[str]:
    return ["-n", NAMESPACE, "get", "cephcluster", CLUSTER, "-o", "jsonpath={.status.ceph.health}"]


def plan_health(ctx: Context) -> list[str]:
    return [
        ctx.kubectl(*health_command(ctx)).display()
        + f"   # every {ctx.poll_interval:g}s until HEALTH_OK, up to {ctx.wait_timeout:g}s"
    ]


def run_health(ctx: Context, log: TextIO) -> None:
    deadline = time.monotonic() + ctx.wait_timeout
    health = ""
    while True:
        outcome = ctx.tools.kube.run(ctx.kubectl(*health_command(ctx)), log)
        health = outcome.stdout.strip()
        log.write(f"{time.strftime('%H:%M:%S')} health={health or '(none yet)'}\n")
        if outcome.ok and health == "HEALTH_OK":
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(ctx.poll_interval)
    details = ctx.tools.kube.run(
        ctx.kubectl("-n", NAMESPACE, "get", "cephcluster", CLUSTER, "-o", "jsonpath={.status.ceph.details}"),
        log,
    ).stdout.strip()
    message = ctx.tools.kube.run(
        ctx.kubectl("-n", NAMESPACE, "get", "cephcluster", CLUSTER, "-o", "jsonpath={.status.message}"), log
    ).stdout.strip()
    what = "; ".join(_details(details)) or message or "no status reported (is the operator running?)"
    raise StepFailed(
        f"Ceph is {health or 'not reporting health'} after {ctx.wait_timeout:g}s: {what}. See "
        f"`kubectl -n {NAMESPACE} get pods` and `kubectl -n {NAMESPACE} logs deploy/rook-ceph-operator`"
    )


def _details(raw: str) -> list[str]:
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        return [raw]
    return [f"{key}: {value.get('message', value)}" for key, value in data.items() if isinstance(value, dict)]


def plan_classes(ctx: Context) -> list[str]:
    return [
        ctx.kubectl("apply", "-f", "-", stdin=STORAGE_CLASSES).display(),
        ctx.kubectl("get", "storageclass", BLOCK_CLASS, FS_CLASS).display(),
    ]


def run_classes(ctx: Context, log: TextIO) -> None:
    ctx.call(
        ctx.tools.kube,
        log,
        ctx.kubectl("apply", "-f", "-", stdin=STORAGE_CLASSES),
        "kubectl apply StorageClasses",
    )
    ctx.call(
        ctx.tools.kube,
        log,
        ctx.kubectl("get", "storageclass", BLOCK_CLASS, FS_CLASS),
        "kubectl get storageclass",
    )


def ceph_steps() -> list[Step]:
    return [
        Step("ceph-values", "choose OSD devices, write the CephCluster values", plan_values, run_values),
        chart_step("ceph-operator", "rook-ceph", "install the Rook-Ceph operator"),
        chart_step("ceph-cluster", "rook-ceph-cluster", "create the CephCluster"),
        Step("ceph-health", "wait for HEALTH_OK", plan_health, run_health),
        Step(
            "ceph-storageclasses",
            f"StorageClasses {BLOCK_CLASS} (default) and {FS_CLASS}",
            plan_classes,
            run_classes,
        ),
    ]
