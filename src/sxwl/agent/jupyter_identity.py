"""Loaded by a dev environment's JupyterLab (agent/runtimes/jupyter.py), not by the agent.

The cloud's proxy adds Jupyter's token to every request it forwards, and Jupyter would then take
each request for a script's and skip its XSRF and Origin checks. The browser behind the proxy is a
browser, so they stay on (``ProxiedIdentityProvider``): the token signs the request in, and nothing
more. And the token stays with the cloud and the agent: JupyterLab would put it in the page it
serves, for its frontend to send back, so this server extension (loaded after ``jupyterlab``, as
Jupyter loads extensions in the order of their names) takes it out of the page, as JupyterHub's
single-user servers do. It also has the page follow a kernel's state after its socket reconnects
(``_track_kernel_info``). Where the owner has SSH keys, the extension also serves the environment's
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
# Taken out of Jupyter's untracked message types (_track_kernel_info).
KERNEL_INFO = frozenset({"kernel_info_request", "kernel_info_reply"})


class ProxiedIdentityProvider(IdentityProvider):
    def should_check_origin(self, handler: Any) -> bool:
        return True

    def is_token_authenticated(self, handler: Any) -> bool:
        return False


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": __name__}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    page = serverapp.web_app.settings.setdefault("page_config_data", {})
    page["token"] = ""
    _track_kernel_info(serverapp.kernel_manager, page)
    config, where = os.environ.get("SXWL_DEV_SSH_CONFIG"), os.environ.get("SXWL_DEV_SSH_SOCKET")
    if config and where and os.path.exists(SSHD):
        threading.Thread(target=_serve_ssh, args=(where, config), name="ssh", daemon=True).start()


def _track_kernel_info(manager: Any, page: dict[str, Any]) -> None:
    """A kernel's socket that reconnects (the agent re-dialled) asks for the kernel's info, and the
    page takes the state the kernel then reports only from messages Jupyter tracks as activity;
    kernel_info is not one by default, so the page would read "Unknown" until the next execution.
    Tracked, a page's (re)connecting also counts as activity, which idle culling counts anyway (an
    open connection). The page's list is set here too: jupyterlab, loaded first, copied it."""
    manager.untracked_message_types = [
        kind for kind in manager.untracked_message_types if kind not in KERNEL_INFO
    ]
    page["untracked_message_types"] = list(manager.untracked_message_types)


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
