"""A real Kubernetes control plane on loopback for tests: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and KWOK (fake GPU nodes), all built from the upstream Go modules by
`scripts/k8s-test-bins.sh` (docs/k8s-testing.md).

Every component runs in its own process group and is stopped through it; each one logs to
`<root>/logs/<component>.log`, and a component that does not come up fails the start with the tails of
all the logs.

Pods on KWOK nodes become Running and stay so, unless an annotation asks otherwise:

- `sxwl.ai/kwok-outcome: succeed` — the pod ends Succeeded (exit code 0);
- `sxwl.ai/kwok-outcome: fail` — the pod ends Failed with exit code `sxwl.ai/kwok-exit-code` (default 1),
  the reason `sxwl.ai/kwok-reason` (default Error: OOMKilled, StartError ...) and the message
  `sxwl.ai/kwok-message` (if any);
- `sxwl.ai/kwok-outcome: image-pull-error` — the pod stays Pending, its containers waiting with reason
  ImagePullBackOff;
- `sxwl.ai/kwok-duration: 2s` — how long the pod runs before the outcome (default 1s).

Outcomes act on the pod as a whole (a real kubelet would restart containers of `restartPolicy:
OnFailure` pods; KWOK does not): give Job pods `restartPolicy: Never`.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import json
import os
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client import ApiClient

from tests.support.net import free_port

REPO = Path(__file__).resolve().parents[2]
BINS_SCRIPT = REPO / "scripts" / "k8s-test-bins.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kubectl", "helm")

OUTCOME = "sxwl.ai/kwok-outcome"
DURATION = "sxwl.ai/kwok-duration"
EXIT_CODE = "sxwl.ai/kwok-exit-code"
MESSAGE = "sxwl.ai/kwok-message"
REASON = "sxwl.ai/kwok-reason"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


class MissingBinariesError(RuntimeError):
    pass


class StartError(RuntimeError):
    pass


def bin_dir() -> Path:
    """The folder that `scripts/k8s-test-bins.sh` builds into for its pinned versions."""
    out = subprocess.run(
        ["bash", str(BINS_SCRIPT), "--print-bin-dir"], capture_output=True, text=True, check=True, timeout=30
    )
    return Path(out.stdout.strip())


def check_binaries(directory: Path) -> None:
    missing = [name for name in BINARIES if not os.access(directory / name, os.X_OK)]
    if missing:
        raise MissingBinariesError(
            f"Kubernetes test binaries missing in {directory}: {', '.join(missing)}. "
            "Run `make k8s-bins` (scripts/k8s-test-bins.sh builds them from the Go modules; see "
            "docs/k8s-testing.md)."
        )


# --- certificates --------------------------------------------------------------------------------


@dataclass
class _KeyPair:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )


def _name(common_name: str, organizations: Sequence[str] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    return x509.Name([*attributes, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _make_ca() -> _KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = _name("sxwl-test-ca")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _KeyPair(cert, key)


def _issue(
    ca: _KeyPair,
    common_name: str,
    organizations: Sequence[str] = (),
    *,
    server: bool = False,
    client: bool = False,
    dns: Sequence[str] = (),
    ips: Sequence[str] = (),
) -> _KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
    usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, organizations))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=False,
                key_cert_sign=False,
                crl_sign=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
    )
    if dns or ips:
        names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return _KeyPair(builder.sign(ca.key, hashes.SHA256()), key)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# --- KWOK configuration --------------------------------------------------------------------------

_POD_NOT_DELETED = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}


def _annotation(name: str) -> str:
    return f'.metadata.annotations["{name}"]'


_RUNNING_STATUS = """\
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: PodReadyToStartContainers
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: ContainersReady
{{ range .spec.readinessGates }}
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: {{ .conditionType | Quote }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
initContainerStatuses:
{{ range .spec.initContainers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  restartCount: 0
  state:
    terminated:
      exitCode: 0
      finishedAt: {{ $now | Quote }}
      reason: Completed
      startedAt: {{ $now | Quote }}
{{ end }}
{{ $hostIPs := NodeIPsWith .spec.nodeName }}
{{ with $hostIPs }}
hostIP: {{ index . 0 | Quote }}
hostIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
{{ $podIPs := PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) \
( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
{{ with $podIPs }}
podIP: {{ index . 0 | Quote }}
podIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""


def _terminated_status(phase: str, exit_code: str, reason: str, message: str) -> str:
    return f"""\
{{{{ $now := Now }}}}
{{{{ $started := or .status.startTime $now }}}}
conditions:
- lastTransitionTime: {{{{ $now | Quote }}}}
  status: "False"
  type: PodReadyToStartContainers
- lastTransitionTime: {{{{ $now | Quote }}}}
  status: "True"
  type: Initialized
- lastTransitionTime: {{{{ $now | Quote }}}}
  reason: PodCompleted
  status: "False"
  type: Ready
- lastTransitionTime: {{{{ $now | Quote }}}}
  reason: PodCompleted
  status: "False"
  type: ContainersReady
containerStatuses:
{{{{ range .spec.containers }}}}
- image: {{{{ .image | Quote }}}}
  name: {{{{ .name | Quote }}}}
  ready: false
  started: false
  restartCount: 0
  state:
    terminated:
      exitCode: {exit_code}
      finishedAt: {{{{ $now | Quote }}}}
      reason: {reason}
      message: {message}
      startedAt: {{{{ $started | Quote }}}}
{{{{ end }}}}
phase: {phase}
"""


def kwok_stages() -> list[dict[str, Any]]:
    """The KWOK Stage objects: node lifecycle, and the pod lifecycle described in the module doc."""
    pod = {"apiGroup": "v1", "kind": "Pod"}
    node = {"apiGroup": "v1", "kind": "Node"}
    duration = {"durationMilliseconds": 1000, "durationFrom": {"expressionFrom": _annotation(DURATION)}}
    exit_code = f'{{{{ or (index $.metadata.annotations "{EXIT_CODE}") "1" }}}}'
    message = f'{{{{ or (index $.metadata.annotations "{MESSAGE}") "" | Quote }}}}'
    reason = f'{{{{ or (index $.metadata.annotations "{REASON}") "Error" | Quote }}}}'

    def stage(
        name: str, ref: dict[str, str], expressions: list[dict[str, Any]], **spec: Any
    ) -> dict[str, Any]:
        return {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Stage",
            "metadata": {"name": name},
            "spec": {"resourceRef": ref, "selector": {"matchExpressions": expressions}, **spec},
        }

    running = {"key": ".status.phase", "operator": "In", "values": ["Running"]}
    return [
        # Nodes: KWOK fills addresses, nodeInfo and conditions (Ready) and keeps the given
        # capacity/allocatable; node leases are renewed by KWOK itself (--node-lease-duration-seconds).
        stage(
            "node-initialize",
            node,
            [
                {
                    "key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
                    "operator": "NotIn",
                    "values": ["True"],
                }
            ],
            next={"statusTemplate": _NODE_STATUS},
        ),
        stage(
            "node-heartbeat",
            node,
            [
                {"key": ".status.phase", "operator": "In", "values": ["Running"]},
                {
                    "key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
                    "operator": "In",
                    "values": ["True"],
                },
            ],
            delay={"durationMilliseconds": 600000, "jitterDurationMilliseconds": 610000},
            next={"statusTemplate": _NODE_HEARTBEAT},
        ),
        stage(
            "pod-ready",
            pod,
            [
                _POD_NOT_DELETED,
                {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
                {
                    "key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
                    "operator": "NotIn",
                    "values": ["True"],
                },
                {"key": _annotation(OUTCOME), "operator": "NotIn", "values": ["image-pull-error"]},
            ],
            next={"statusTemplate": _RUNNING_STATUS},
        ),
        stage(
            "pod-image-pull-error",
            pod,
            [
                _POD_NOT_DELETED,
                {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
                {"key": _annotation(OUTCOME), "operator": "In", "values": ["image-pull-error"]},
                {
                    "key": ".status.containerStatuses.[].state.waiting.reason",
                    "operator": "NotIn",
                    "values": ["ImagePullBackOff"],
                },
            ],
            next={"statusTemplate": _IMAGE_PULL_ERROR_STATUS},
        ),
        stage(
            "pod-succeed",
            pod,
            [
                _POD_NOT_DELETED,
                running,
                {"key": _annotation(OUTCOME), "operator": "In", "values": ["succeed"]},
            ],
            delay=duration,
            next={
                "event": {"type": "Normal", "reason": "Completed", "message": "kwok: outcome succeed"},
                "statusTemplate": _terminated_status("Succeeded", "0", "Completed", "''"),
            },
        ),
        stage(
            "pod-fail",
            pod,
            [_POD_NOT_DELETED, running, {"key": _annotation(OUTCOME), "operator": "In", "values": ["fail"]}],
            delay=duration,
            next={
                "event": {"type": "Warning", "reason": "Failed", "message": "kwok: outcome fail"},
                "statusTemplate": _terminated_status("Failed", exit_code, reason, message),
            },
        ),
        stage(
            "pod-delete",
            pod,
            [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}],
            next={"delete": True},
        ),
    ]


_NODE_STATUS = """\
{{ $now := Now }}
{{ $lastTransitionTime := or .metadata.creationTimestamp $now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $lastTransitionTime | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
addresses:
{{ with NodeIP }}
- address: {{ . | Quote }}
  type: InternalIP
{{ end }}
{{ with NodeName }}
- address: {{ . | Quote }}
  type: Hostname
{{ end }}
{{ with NodePort }}
daemonEndpoints:
  kubeletEndpoint:
    Port: {{ . }}
{{ end }}
allocatable:
{{ with .status.allocatable }}
{{ YAML . 1 }}
{{ else }}
  cpu: 1k
  memory: 1Ti
  pods: 1M
{{ end }}
capacity:
{{ with .status.capacity }}
{{ YAML . 1 }}
{{ else }}
  cpu: 1k
  memory: 1Ti
  pods: 1M
{{ end }}
{{ $nodeInfo := .status.nodeInfo }}
{{ $kwokVersion := printf "kwok-%s" Version }}
nodeInfo:
  architecture: {{ or $nodeInfo.architecture "amd64" }}
  bootID: {{ or $nodeInfo.bootID `""` }}
  containerRuntimeVersion: {{ or $nodeInfo.containerRuntimeVersion $kwokVersion }}
  kernelVersion: {{ or $nodeInfo.kernelVersion $kwokVersion }}
  kubeProxyVersion: {{ or $nodeInfo.kubeProxyVersion $kwokVersion }}
  kubeletVersion: {{ or $nodeInfo.kubeletVersion $kwokVersion }}
  machineID: {{ or $nodeInfo.machineID `""` }}
  operatingSystem: {{ or $nodeInfo.operatingSystem "linux" }}
  osImage: {{ or $nodeInfo.osImage `""` }}
  systemUUID: {{ or $nodeInfo.systemUUID `""` }}
phase: Running
"""

_NODE_HEARTBEAT = """\
{{ $now := Now }}
{{ $lastTransitionTime := or .metadata.creationTimestamp $now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $lastTransitionTime | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
"""

_IMAGE_PULL_ERROR_STATUS = """\
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  reason: ContainersNotReady
  status: "False"
  type: Ready
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  started: false
  restartCount: 0
  state:
    waiting:
      reason: ImagePullBackOff
      message: {{ printf "Back-off pulling image %q" .image | Quote }}
{{ end }}
phase: Pending
"""


# --- the cluster ---------------------------------------------------------------------------------


@dataclass
class _Component:
    name: str
    process: subprocess.Popen[bytes]
    log: Path


@dataclass
class GpuNodeSpec:
    """Facts about one KWOK GPU node, as GPU Feature Discovery and the device plugin would report them."""

    product: str
    memory_mib: int
    gpus: int
    cpu: str = "64"
    memory: str = "512Gi"
    pods: str = "110"
    driver: tuple[int, int, int] = (550, 54, 15)
    cuda_runtime: tuple[int, int] = (12, 4)
    labels: dict[str, str] = field(default_factory=dict)


def gpu_node_manifest(name: str, spec: GpuNodeSpec) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": spec.product,
        "nvidia.com/gpu.memory": str(spec.memory_mib),
        "nvidia.com/gpu.count": str(spec.gpus),
        "nvidia.com/cuda.driver.major": str(spec.driver[0]),
        "nvidia.com/cuda.driver.minor": str(spec.driver[1]),
        "nvidia.com/cuda.driver.rev": str(spec.driver[2]),
        "nvidia.com/cuda.runtime.major": str(spec.cuda_runtime[0]),
        "nvidia.com/cuda.runtime.minor": str(spec.cuda_runtime[1]),
        **spec.labels,
    }
    resources = {"cpu": spec.cpu, "memory": spec.memory, "pods": spec.pods, "nvidia.com/gpu": str(spec.gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {KWOK_NODE_ANNOTATION: "fake"}},
        "status": {"capacity": resources, "allocatable": resources},
    }


class K8sCluster:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + KWOK on loopback."""

    def __init__(self, root: Path | None = None, bins: Path | None = None) -> None:
        self.bins = bins if bins is not None else bin_dir()
        check_binaries(self.bins)
        self.root = root if root is not None else Path(tempfile.mkdtemp(prefix="sxwl-k8s-"))
        self.pki = self.root / "pki"
        self.logs = self.root / "logs"
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.apiserver_port = free_port()
        self.controller_manager_port = free_port()
        self.scheduler_port = free_port()
        self.kwok_port = free_port()
        self.server = f"https://127.0.0.1:{self.apiserver_port}"
        self.ca_file = self.pki / "ca.crt"
        self.kubeconfig = self.root / "admin.kubeconfig"
        self._components: list[_Component] = []
        self._ca: _KeyPair | None = None

    # -- lifecycle --

    def start(self, timeout: float = 120.0) -> K8sCluster:
        try:
            self._start(time.monotonic() + timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, deadline: float) -> None:
        self.pki.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self._write_pki()

        etcd = self._spawn(
            "etcd",
            [
                "--name=sxwl-test",
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{self.etcd_peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{self.etcd_peer_port}",
                f"--initial-cluster=sxwl-test=http://127.0.0.1:{self.etcd_peer_port}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self._wait(etcd, deadline, lambda: self._http_ok(f"http://127.0.0.1:{self.etcd_port}/health"))

        pki = self.pki
        apiserver = self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.apiserver_port}",
                f"--cert-dir={pki}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={self.ca_file}",
                # the front-proxy (aggregation) settings kubeadm makes; without them controllers log errors
                f"--requestheader-client-ca-file={self.ca_file}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                "--authorization-mode=Node,RBAC",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",  # the loopback address is no valid endpoint
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                "--kubelet-preferred-address-types=InternalIP",
                "--profiling=false",
                "--v=1",
            ],
        )
        self._wait(apiserver, deadline, lambda: self._api_ok("/readyz"))

        controller_manager = self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={self.root / 'controller-manager.kubeconfig'}",
                f"--authentication-kubeconfig={self.root / 'controller-manager.kubeconfig'}",
                f"--authorization-kubeconfig={self.root / 'controller-manager.kubeconfig'}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.controller_manager_port}",
                f"--cert-dir={self.root / 'controller-manager'}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={self.ca_file}",
                f"--cluster-signing-cert-file={self.ca_file}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # No cloud and no pod network: the controllers that need them stay off.
                "--controllers=*,-node-ipam-controller",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--concurrent-job-syncs=10",
                "--profiling=false",
                "--v=1",
            ],
        )
        scheduler = self._spawn(
            "kube-scheduler",
            [
                f"--kubeconfig={self.root / 'scheduler.kubeconfig'}",
                f"--authentication-kubeconfig={self.root / 'scheduler.kubeconfig'}",
                f"--authorization-kubeconfig={self.root / 'scheduler.kubeconfig'}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.scheduler_port}",
                f"--cert-dir={self.root / 'scheduler'}",
                "--leader-elect=false",
                "--profiling=false",
                "--v=1",
            ],
        )
        stages = self.root / "kwok.yaml"
        stages.write_text(yaml.safe_dump_all(kwok_stages(), sort_keys=False))
        kwok = self._spawn(
            "kwok",
            [
                f"--kubeconfig={self.root / 'kwok.kubeconfig'}",
                f"--config={stages}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                "--node-lease-duration-seconds=40",
                "--cidr=10.244.0.0/16",
                "--node-ip=127.0.0.1",
                f"--node-port={self.kwok_port}",
                f"--server-address=127.0.0.1:{self.kwok_port}",
                f"--tls-cert-file={pki / 'kwok.crt'}",
                f"--tls-private-key-file={pki / 'kwok.key'}",
            ],
            # KWOK also reads ~/.kwok/kwok.yaml when it exists: give it a home of its own.
            env={"HOME": str(self.root / "kwok-home")},
        )
        self._wait(controller_manager, deadline, lambda: self._https_ok(self.controller_manager_port))
        self._wait(scheduler, deadline, lambda: self._https_ok(self.scheduler_port))
        # The ServiceAccount controller makes "default" in each namespace; pods need it.
        self._wait(
            controller_manager,
            deadline,
            lambda: self._api_ok("/api/v1/namespaces/default/serviceaccounts/default"),
        )
        self._wait(kwok, deadline, lambda: self._https_ok(self.kwok_port, "/healthz", any_status=True))

    def stop(self) -> None:
        """Stops every component through its process group, the last started first."""
        for component in reversed(self._components):
            stop_group(component.process)
        self._components.clear()

    def __enter__(self) -> K8sCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- helpers for tests --

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 60) -> str:
        """Runs the pinned kubectl against the cluster as admin and returns its stdout."""
        result = subprocess.run(
            [str(self.bins / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result.stdout

    def helm(self, *args: str, check: bool = True, timeout: float = 120) -> str:
        homes = {
            f"HELM_{kind.upper()}_HOME": str(self.root / "helm" / kind)
            for kind in ("cache", "config", "data")
        }
        result = subprocess.run(
            [str(self.bins / "helm"), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **homes},
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"helm {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result.stdout

    def apply(self, manifest: str | dict[str, Any] | Sequence[dict[str, Any]]) -> str:
        """`kubectl apply` of YAML text, one object, or a list of objects (server-side apply)."""
        if isinstance(manifest, str):
            text = manifest
        elif isinstance(manifest, dict):
            text = json.dumps(manifest)
        else:
            text = yaml.safe_dump_all(list(manifest))
        return self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=text)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        args = ["get", kind, name, "-o", "json"]
        if namespace:
            args += ["-n", namespace]
        obj: dict[str, Any] = json.loads(self.kubectl(*args))
        return obj

    def add_gpu_nodes(
        self,
        prefix: str,
        count: int,
        product: str,
        memory_mib: int,
        gpus: int,
        *,
        wait: bool = True,
        timeout: float = 60,
        **extra: Any,
    ) -> list[str]:
        """Creates `count` KWOK nodes `<prefix>-0..` with GPU Feature Discovery labels and
        `nvidia.com/gpu` capacity; waits until they are Ready unless told not to."""
        spec = GpuNodeSpec(product=product, memory_mib=memory_mib, gpus=gpus, **extra)
        names = [f"{prefix}-{i}" for i in range(count)]
        # Created (not applied): a Node's status is kept on create, as when a kubelet registers.
        text = yaml.safe_dump_all([gpu_node_manifest(name, spec) for name in names])
        self.kubectl("create", "-f", "-", stdin=text)
        if wait:
            self.wait_nodes_ready(names, timeout=timeout)
        return names

    def wait_nodes_ready(self, names: Sequence[str], timeout: float = 60) -> None:
        nodes = [f"node/{name}" for name in names]
        self.kubectl(
            "wait", "--for=condition=Ready", f"--timeout={int(timeout)}s", *nodes, timeout=timeout + 10
        )

    def write_token_kubeconfig(self, path: Path, token: str, namespace: str = "default") -> Path:
        """A kubeconfig that authenticates with a bearer token (e.g. a ServiceAccount's)."""
        self._write_kubeconfig(path, "token-user", {"token": token}, namespace)
        return path

    def issue_certificate(
        self,
        name: str,
        common_name: str,
        organizations: Sequence[str] = (),
        *,
        server: bool = False,
        client: bool = False,
        ips: Sequence[str] = (),
    ) -> tuple[Path, Path]:
        """A certificate signed by the cluster's CA, as `<pki>/<name>.crt` and `.key` (returned), for
        components started outside this class (the real nodes of tests/support/k8s_node.py)."""
        if self._ca is None:
            raise RuntimeError("the cluster's CA exists once the cluster has started")
        self._write_pair(
            name, _issue(self._ca, common_name, organizations, server=server, client=client, ips=ips)
        )
        return self.pki / f"{name}.crt", self.pki / f"{name}.key"

    def write_cert_kubeconfig(self, path: Path, cert: Path, key: Path) -> Path:
        """A kubeconfig that authenticates with a client certificate from `issue_certificate`."""
        user = {"client-certificate-data": _b64(cert.read_bytes()), "client-key-data": _b64(key.read_bytes())}
        self._write_kubeconfig(path, cert.stem, user)
        return path

    def ssl_context(self, client: bool = True) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if client:
            context.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return context

    def log_tails(self, lines: int = 40) -> str:
        parts = []
        for log in sorted(self.logs.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log.name} (last {len(tail)} lines) ---\n" + "\n".join(tail))
        return "\n".join(parts)

    # -- internals --

    def _write_pki(self) -> None:
        ca = _make_ca()
        self._ca = ca
        self._write_pair("ca", ca)
        service_ip = str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))
        self._write_pair(
            "apiserver",
            _issue(
                ca,
                "kube-apiserver",
                server=True,
                dns=[
                    "localhost",
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                ],
                ips=["127.0.0.1", service_ip],
            ),
        )
        self._write_pair(
            "apiserver-kubelet-client",
            _issue(ca, "kube-apiserver-kubelet-client", ["kubeadm:cluster-admins"], client=True),
        )
        self._write_pair("kwok", _issue(ca, "kwok", server=True, dns=["localhost"], ips=["127.0.0.1"]))
        sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (self.pki / "sa.key").write_bytes(
            sa_key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            )
        )
        (self.pki / "sa.pub").write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        clients = {
            "admin": ("sxwl-test-admin", ["system:masters"]),
            "controller-manager": ("system:kube-controller-manager", []),
            "scheduler": ("system:kube-scheduler", []),
            # KWOK plays every kubelet (node status, leases, pod status, deletes): admin rights.
            "kwok": ("kwok", ["system:masters"]),
        }
        for name, (common_name, groups) in clients.items():
            pair = _issue(ca, common_name, groups, client=True)
            self._write_pair(name, pair)
            user = {
                "client-certificate-data": _b64(pair.cert_pem()),
                "client-key-data": _b64(pair.key_pem()),
            }
            self._write_kubeconfig(self.root / f"{name}.kubeconfig", name, user)

    def _write_pair(self, name: str, pair: _KeyPair) -> None:
        (self.pki / f"{name}.crt").write_bytes(pair.cert_pem())
        key = self.pki / f"{name}.key"
        key.write_bytes(pair.key_pem())
        key.chmod(0o600)

    def _write_kubeconfig(
        self, path: Path, user: str, credentials: dict[str, str], namespace: str = "default"
    ) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "sxwl-test",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": _b64(self.ca_file.read_bytes()),
                    },
                }
            ],
            "users": [{"name": user, "user": credentials}],
            "contexts": [
                {
                    "name": "sxwl-test",
                    "context": {"cluster": "sxwl-test", "user": user, "namespace": namespace},
                }
            ],
            "current-context": "sxwl-test",
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> _Component:
        log = self.logs / f"{name}.log"
        if env and "HOME" in env:
            Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            process = subprocess.Popen(
                [str(self.bins / name), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped through it, never by name
                env={**os.environ, **(env or {})},
                cwd=self.root,
            )
        component = _Component(name, process, log)
        self._components.append(component)
        return component

    def _wait(self, component: _Component, deadline: float, ready: Callable[[], bool]) -> None:
        while True:
            for other in self._components:
                if other.process.poll() is not None:
                    raise StartError(
                        f"{other.name} exited with code {other.process.returncode} while the test "
                        f"control plane was starting (logs in {self.logs}):\n{self.log_tails()}"
                    )
            if ready():
                return
            if time.monotonic() > deadline:
                raise StartError(
                    f"{component.name} did not become ready in time (logs in {self.logs}):\n"
                    f"{self.log_tails()}"
                )
            time.sleep(0.25)

    @staticmethod
    def _http_ok(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (loopback http)
                return bool(response.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def _api_ok(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(  # noqa: S310 (loopback https)
                self.server + path, timeout=2, context=self.ssl_context()
            ) as response:
                return bool(response.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    @staticmethod
    def _https_ok(port: int, path: str = "/healthz", any_status: bool = False) -> bool:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # their self-signed serving certs: only liveness is asked
        try:
            with urllib.request.urlopen(
                f"https://127.0.0.1:{port}{path}", timeout=2, context=context
            ) as response:
                return bool(response.status == 200)
        except urllib.error.HTTPError:
            return any_status
        except (OSError, urllib.error.URLError):
            return False


def stop_group(process: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        process.wait(timeout=grace)


# --- async API clients (kubernetes_asyncio, the client the agent's kubernetes runtime uses) ---------


@asynccontextmanager
async def api_client(kubeconfig: Path) -> AsyncIterator[ApiClient]:
    """An API client for a kubeconfig (the admin's, or one from `write_token_kubeconfig`)."""
    client = await k8s_config.new_client_from_config(config_file=str(kubeconfig), persist_config=False)
    try:
        yield client
    finally:
        await client.close()


async def wait_until(
    check: Callable[[], Awaitable[Any]], seconds: float = 60.0, interval: float = 0.25, what: str = ""
) -> Any:
    """Polls `check` until it returns something truthy, and returns that; fails after `seconds`."""
    deadline = time.monotonic() + seconds
    last: Any = None
    while True:
        last = await check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {seconds}s waiting for {what or check}; last: {last!r}")
        await asyncio.sleep(interval)
