"""A dev environment's JupyterLab on the local runtime (docs/dev-envs.md): the agent runs it in the
attempt's sandbox instead of the job's command, on a Unix socket in the attempt's workspace (so
nothing listens on the provider's network, and the tunnel reaches it from outside the sandbox's
network namespace), with its token in a file only the attempt's uid reads (never on a command line)
and the proxy's token not turning off its XSRF and Origin checks (agent/jupyter_identity.py)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from sxwl.agent.inputs import writable_tree
from sxwl.agent.runtimes.sandbox import SandboxPaths
from sxwl.agent.runtimes.sandbox_mounts import CODE_ROOT
from sxwl.protocol.devenvs import DevEnvSpec

# In the workspace, hidden from JupyterLab's file browser: the socket and the token file.
RUN_DIR = ".sxwl-dev"
SOCKET = "jupyter.sock"
TOKEN_FILE = "token"  # noqa: S105 - a file's name
PROXIED = "sxwl.agent.jupyter_identity"


def jupyter_command(
    spec: DevEnvSpec, paths: SandboxPaths, isolated: bool, uid: int | None
) -> tuple[list[str], dict[str, str]]:
    """Writes the token file and returns JupyterLab's command and the variables it adds."""

    def seen(path: Path) -> str:
        return str(paths.inside(path) if isolated else path)

    run = paths.work / RUN_DIR
    run.mkdir(mode=0o700)
    token = run / TOKEN_FILE
    token.write_text(spec.token)
    os.chmod(token, 0o400)
    if uid is not None:
        for path in (run, token):
            os.chown(path, uid, uid)
    argv = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        f"--ServerApp.sock={seen(run / SOCKET)}",
        "--ServerApp.sock_mode=0600",
        f"--ServerApp.base_url={spec.base_url}",
        f"--ServerApp.root_dir={seen(paths.work)}",
        # Reached only through its socket, with the Host of the cloud the browser talks to.
        "--ServerApp.allow_remote_access=True",
        f"--ServerApp.identity_provider_class={PROXIED}.ProxiedIdentityProvider",
        f"--ServerApp.jpserver_extensions={{'{PROXIED}': True}}",  # the token out of the page
        "--LabApp.news_url=",  # no calls out from a CPod that may have no network
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    env = {
        "JUPYTER_TOKEN_FILE": seen(token),
        "PYTHONPATH": str(CODE_ROOT),  # the agent's own sxwl, for the identity provider
        "SHELL": "/bin/bash" if Path("/bin/bash").exists() else "/bin/sh",  # the terminals'
    }
    return argv, env


def workspace(state_dir: Path, spec: DevEnvSpec, uid: int | None) -> Path:
    """The environment's workspace, kept across its attempts (a paused environment resumes with
    it): made on the first, and on each later one handed to the attempt's uid, without what the
    last attempt was given (its inputs, its socket and token), which this one is given afresh."""
    root = state_dir / "workspaces"
    root.mkdir(mode=0o700, exist_ok=True)
    work = root / spec.workspace
    work.mkdir(mode=0o700, exist_ok=True)
    for given in (work / "inputs", work / RUN_DIR):
        if given.is_dir() and not given.is_symlink():
            writable_tree(given)
            shutil.rmtree(given)
        elif given.exists() or given.is_symlink():
            given.unlink()
    if uid is not None:
        # Links are changed themselves, never what they point to (os.chown would follow them).
        for path in [work, *work.rglob("*")]:
            os.chown(path, uid, uid, follow_symlinks=False)
    return work
