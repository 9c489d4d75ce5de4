"""The API server at the `kubernetes` Service's address, for pods on the real test nodes, during one
test: what kube-proxy does in a real cluster. The test control plane listens on loopback only and the
nodes run no kube-proxy, so by default no pod reaches it (tests/k8s/test_real_jobs.py holds a tenant
job to that). A pod that must, such as the agent installed from its chart, uses the in-cluster
config: KUBERNETES_SERVICE_HOST, the Service's first address, which the API server's certificate
names. Here that address is put on the host's loopback (the nodes route everything else to the host)
and a TCP relay there hands each connection to the API server; TLS runs end to end through it.
Both go when the block ends."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import subprocess
import threading
from collections.abc import Iterator

from tests.support.k8s import SERVICE_CIDR, K8sCluster

LABEL = "lo:sxwlapi"  # names the address, so that a reader of `ip addr` knows whose it is


def _pump(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            target.sendall(data)
        target.shutdown(socket.SHUT_WR)
    except OSError:  # the other side went, or the relay is closing them all
        pass


class _Relay:
    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int]) -> None:
        self.listener = socket.create_server(listen)
        self.listener.settimeout(0.2)
        self.upstream = upstream
        self.open: list[socket.socket] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="k8s-api-relay", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            client.settimeout(None)
            self.open += [client, server]
            for one, other in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(one, other), daemon=True).start()

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.listener.close()
        for sock in self.open:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


@contextlib.contextmanager
def api_for_pods(cluster: K8sCluster) -> Iterator[str]:
    """Yields the Service address at which the real nodes' pods reach the API server meanwhile."""
    address = str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))
    port = int(cluster.server.rsplit(":", 1)[1])
    # One session runs real nodes at a time: an address there now was left by a killed one.
    subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", "lo"], check=False, capture_output=True)
    subprocess.run(
        ["ip", "addr", "add", f"{address}/32", "dev", "lo", "label", LABEL], check=True, capture_output=True
    )
    try:
        relay = _Relay((address, 443), ("127.0.0.1", port))
        try:
            yield address
        finally:
            relay.close()
    finally:
        subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", "lo"], check=False, capture_output=True)
