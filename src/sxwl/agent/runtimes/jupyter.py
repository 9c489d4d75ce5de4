"""A dev environment's JupyterLab on the local runtime (docs/dev-envs.md): the agent runs it in the
attempt's sandbox instead of the job's command, on a Unix socket in the attempt's workspace (so
nothing listens on the provider's network, and the tunnel reaches it from outside the sandbox's
network namespace), with its token in a file only the attempt's uid reads (never on a command line)
and the proxy's token not turning off its XSRF and Origin checks (agent/jupyter_identity.py)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

from sxwl.agent.inputs import writable_tree
from sxwl.agent.runtimes.sandbox import SandboxPaths
from sxwl.agent.runtimes.sandbox_mounts import CODE_ROOT, JOB_WORK
from sxwl.protocol.devenvs import WORKSPACE_ARTIFACT, DevEnvSpec

# In the workspace, hidden from JupyterLab's file browser: the socket and the token file.
RUN_DIR = ".sxwl-dev"
SOCKET = "jupyter.sock"
TOKEN_FILE = "token"  # noqa: S105 - a file's name
PROXIED = "sxwl.agent.jupyter_identity"
SSH_SOCKET = "ssh.sock"  # where the environment's sshd is reached, one sshd -i per connection
SSH_USER = "sxwl"  # the attempt's uid, as the sandbox's /etc/passwd names it for sshd
SSHD = "/usr/sbin/sshd"
SHELL = "/bin/bash" if Path("/bin/bash").exists() else "/bin/sh"
WORKSPACE_TAR = WORKSPACE_ARTIFACT  # an output of each attempt: the cloud keeps it for a resume elsewhere
GIVEN = ("inputs", RUN_DIR)  # what each attempt is given afresh: not the user's work
MODULE = ("-m", "jupyterlab")
# JupyterLab's start as ``-m jupyterlab`` runs it, less two things it does at every start that a
# dev environment never uses; with UNUSED_EXTENSIONS and the read-only extension manager, its start
# went from 4.4–5.3 s of CPU to 1.3–1.5 s (docs/dev-envs.md, "Measured"):
# - jsonschema's optional IRI format check: rfc3987_syntax builds an Earley parser as it is
#   imported (about 2.7 s of CPU), which jupyter_events' import of jsonschema does. Only Jupyter's
#   own event schemas are checked with jsonschema's formats there, and none has an IRI; the user's
#   code runs in its kernels, other processes;
# - asking yarn, a Node.js process, for its npm registry (about 0.7 s of CPU, where Node.js is
#   installed): the registry is only for building extensions, which the read-only extension manager
#   (``lab_flags``) never does.
LAB_START = """
import sys
sys.modules["rfc3987_syntax"] = None
import jupyterlab.commands
jupyterlab.commands._yarn_config = lambda logger: {"yarn config": {}, "npm config": {}}
from jupyterlab.labapp import main
sys.exit(main())
"""
# jupyter_lsp looks for language servers at every start: the agent's Python has none, and the
# sandbox cannot install one there (it is read-only).
UNUSED_EXTENSIONS = ("jupyter_lsp",)


def jupyter_command(
    spec: DevEnvSpec, paths: SandboxPaths, isolated: bool, uid: int | None
) -> tuple[list[str], dict[str, str], SandboxPaths]:
    """Writes the token file (and the sshd's files) and returns JupyterLab's command, the variables
    it adds and the attempt's paths with the files bound over the machine's."""

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
    listen = [f"--ServerApp.sock={seen(run / SOCKET)}", "--ServerApp.sock_mode=0600"]
    flags = lab_flags(listen, spec.base_url, seen(paths.work), PROXIED, ("-c", LAB_START), UNUSED_EXTENSIONS)
    argv = [sys.executable, *flags]
    env = {
        "JUPYTER_TOKEN_FILE": seen(token),
        "PYTHONPATH": str(CODE_ROOT),  # the agent's own sxwl, for the identity provider
        "SHELL": SHELL,  # the terminals'
    }
    if spec.ssh_keys and isolated and uid is not None and Path(SSHD).exists():
        config = ssh_files(spec, paths.work, run, uid, seen)
        passwd = paths.output.parent / "passwd"  # the agent's own dir: the attempt cannot change it
        passwd.write_text(Path("/etc/passwd").read_text() + f"{SSH_USER}:x:{uid}:{uid}::{JOB_WORK}:{SHELL}\n")
        paths = dataclasses.replace(paths, files=(*paths.files, (passwd, Path("/etc/passwd"))))
        env |= {"SXWL_DEV_SSH_CONFIG": seen(config), "SXWL_DEV_SSH_SOCKET": seen(run / SSH_SOCKET)}
    return argv, env, paths


def lab_flags(
    listen: list[str],
    base_url: str,
    root_dir: str,
    identity: str,
    start: tuple[str, ...] = MODULE,
    unused: tuple[str, ...] = (),
) -> list[str]:
    """JupyterLab's start (``start``: ``-m jupyterlab``) and its flags, after the interpreter: where
    it listens (``listen``), its ``base_url`` and root, ``identity``, the module of
    jupyter_identity.py as it is imported there, and the server extensions left out (``unused``)."""
    extensions = {identity: True} | dict.fromkeys(unused, False)
    return [
        *start,
        "--no-browser",
        *listen,
        f"--ServerApp.base_url={base_url}",
        f"--ServerApp.root_dir={root_dir}",
        # Reached only through the agent, with the Host of the cloud the browser talks to.
        "--ServerApp.allow_remote_access=True",
        f"--ServerApp.identity_provider_class={identity}.ProxiedIdentityProvider",
        f"--ServerApp.jpserver_extensions={extensions!r}",  # ``identity``: the token out of the page
        "--LabApp.news_url=",  # no calls out from a CPod that may have no network
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        # Nor to PyPI: an extension installed from JupyterLab's page would go into the interpreter
        # that runs it, which a dev environment cannot keep (the agent's is read-only, an image's
        # goes with its pod).
        "--LabApp.extension_manager=readonly",
    ]


def sshd_config(host_key: str, authorized: str) -> str:
    """The environment's sshd config: only the owner's keys, for the one user it runs as."""
    return (
        f"HostKey {host_key}\nAuthorizedKeysFile {authorized}\nAllowUsers {SSH_USER}\n"
        "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "UsePAM no\nStrictModes no\nPidFile none\nPermitUserEnvironment no\n"
        "Subsystem sftp internal-sftp\n"
    )


def ssh_files(spec: DevEnvSpec, work: Path, run: Path, uid: int, seen: Callable[[Path], str]) -> Path:
    """The environment's sshd: its host key kept in the workspace (the same across resumes), the
    owner's keys of this start, and a config that takes only those keys, for the one user it runs as."""
    keys = work / ".sxwl-ssh"
    keys.mkdir(mode=0o700, exist_ok=True)
    host_key = keys / "ssh_host_ed25519_key"
    if not host_key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    authorized = run / "authorized_keys"
    authorized.write_text("".join(f"{line}\n" for line in spec.ssh_keys))
    config = run / "sshd_config"
    config.write_text(sshd_config(seen(host_key), seen(authorized)))
    for path in (keys, *keys.iterdir(), authorized, config):
        os.chown(path, uid, uid)
    return config


def workspace(state_dir: Path, spec: DevEnvSpec, uid: int | None, saved: Path | None = None) -> Path:
    """The environment's workspace, kept across its attempts (a paused environment resumes with
    it): made on the first, and on each later one handed to the attempt's uid, without what the
    last attempt was given (its inputs, its socket and token), which this one is given afresh.
    ``saved``: the workspace as another CPod saved it (the input cache's unpacked tree), copied in
    when this CPod has none."""
    root = state_dir / "workspaces"
    root.mkdir(mode=0o700, exist_ok=True)
    work = root / spec.workspace
    if not work.exists() and saved is not None:
        shutil.copytree(saved, work, symlinks=True, copy_function=shutil.copyfile)
        for where, _dirs, _files in os.walk(work):
            os.chmod(where, 0o700)  # the cache's tree is read-only; the copy is the user's
    work.mkdir(mode=0o700, exist_ok=True)
    for given in (work / name for name in GIVEN):
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


def forget_workspace(state_dir: Path, env_id: str) -> bool:
    """Removes a stopped environment's workspace (``forget_workspace``); False when there was none.
    Its links are removed, never followed: the tenant made them."""
    work = state_dir / "workspaces" / env_id
    if not work.is_dir() or work.is_symlink():
        return False
    shutil.rmtree(work)
    return True


def save_workspace(work: Path, output: Path, limit: int | None, uid: int) -> bool:
    """The workspace as a tar among the attempt's outputs (``WORKSPACE_TAR``), which the agent
    uploads as an artifact with the rest, so that another CPod can restore it. Only directories and
    regular files are saved (a link is not followed nor kept: the agent reads as root what the
    tenant wrote), nor what the attempt was given; nothing is saved past ``limit`` bytes (the
    largest artifact the cloud takes), and the workspace stays on this CPod either way."""
    entries: list[Path] = []
    total = 0
    for where, dirs, files in os.walk(work):
        here = Path(where)
        if here == work:
            dirs[:] = [d for d in dirs if d not in GIVEN]
        for name in [*dirs, *files]:
            path = here / name
            info = path.lstat()
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
            elif not stat.S_ISDIR(info.st_mode):
                continue
            entries.append(path)
        dirs[:] = [d for d in dirs if (here / d).is_dir() and not (here / d).is_symlink()]
    if limit is not None and total > limit:
        return False
    target = output / WORKSPACE_TAR
    with tarfile.open(target, "w") as archive:
        for path in entries:
            archive.add(path, arcname=str(path.relative_to(work)), recursive=False)
    os.chown(target, uid, uid)
    return True
