"""Loaded by a dev environment's JupyterLab (agent/runtimes/jupyter.py), not by the agent.

The cloud's proxy adds Jupyter's token to every request it forwards, and Jupyter would then take
each request for a script's and skip its XSRF and Origin checks. The browser behind the proxy is a
browser, so they stay on (``ProxiedIdentityProvider``): the token signs the request in, and nothing
more. And the token stays with the cloud and the agent: JupyterLab would put it in the page it
serves, for its frontend to send back, so this server extension (loaded after ``jupyterlab``, as
Jupyter loads extensions in the order of their names) takes it out of the page, as JupyterHub's
single-user servers do. Where the owner has SSH keys, the extension also serves the environment's
sshd on a Unix socket (docs/dev-envs.md, "SSH")."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
from typing import Any

from jupyter_server.auth.identity import IdentityProvider

SSHD = "/usr/sbin/sshd"


class ProxiedIdentityProvider(IdentityProvider):
    def should_check_origin(self, handler: Any) -> bool:
        return True

    def is_token_authenticated(self, handler: Any) -> bool:
        return False


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": __name__}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    serverapp.web_app.settings.setdefault("page_config_data", {})["token"] = ""
    config, where = os.environ.get("SXWL_DEV_SSH_CONFIG"), os.environ.get("SXWL_DEV_SSH_SOCKET")
    if config and where and os.path.exists(SSHD):
        threading.Thread(target=_serve_ssh, args=(where, config), name="ssh", daemon=True).start()


def _serve_ssh(where: str, config: str) -> None:
    """The environment's SSH: one ``sshd -i`` per connection to its socket, which the agent reaches
    through the tunnel. sshd runs here, as the attempt's uid in its sandbox, with the owner's keys.
    ``tcp:PORT``: on the pod's address instead (a Kubernetes environment, whose NetworkPolicy admits
    only the agent), with a host key made here on the first start and kept in the workspace."""
    if where.startswith("tcp:"):
        host_key = os.environ.get("SXWL_DEV_SSH_HOST_KEY", "")
        if host_key and not os.path.exists(host_key):
            os.makedirs(os.path.dirname(host_key), mode=0o700, exist_ok=True)
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", host_key], check=True)
        server = socket.create_server(("", int(where.removeprefix("tcp:"))), backlog=16)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(where)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(where)
        os.chmod(where, 0o600)
        server.listen(16)
    children: list[subprocess.Popen[bytes]] = []
    while True:
        conn, _ = server.accept()
        with conn:
            children = [child for child in children if child.poll() is None]  # the ended reaped
            fd = conn.fileno()  # sshd speaks on it; this process's copy closes with ``conn``
            children.append(subprocess.Popen([SSHD, "-i", "-e", "-f", config], stdin=fd, stdout=fd))
