"""``sxwl dev ssh|ssh-config|ssh-proxy`` and ``sxwl ssh-keys``: SSH into a dev environment through
the cloud and the agent's tunnel (docs/dev-envs.md, "SSH"), so that ``ssh``, ``scp``, ``rsync`` and
VS Code Remote-SSH work unchanged, with the public keys kept on the user's account."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from sxwl.cli import client
from sxwl.cli.client import CliError, Credentials
from sxwl.cli.dev import ID_HELP, app, env_by_id
from sxwl.cli.output import listing, out, show

keys_app = typer.Typer(help="Your SSH public keys, which your dev environments accept.", no_args_is_help=True)
SSH_USER = "sxwl"  # the user the environment's sshd runs as


def proxy_command(env_id: str) -> str:
    return f"{shlex.quote(sys.executable)} -m sxwl.cli dev ssh-proxy {env_id}"


@app.command("ssh-proxy")
def ssh_proxy(env_id: Annotated[str, typer.Argument(help="Environment id.")]) -> None:
    """OpenSSH's ProxyCommand: this process's stdin and stdout are the SSH connection to the environment."""
    creds = Credentials.load()
    url = creds.url.rstrip("/").replace("https://", "wss://").replace("http://", "ws://")
    try:
        ws = connect(
            f"{url}/api/v1/dev-envs/{env_id}/ssh",
            additional_headers={"Authorization": f"Bearer {creds.token}"},
            max_size=None,
        )
    except (InvalidStatus, OSError) as exc:
        raise CliError(f"cannot reach dev environment {env_id}'s sshd: {exc}") from None

    def upload() -> None:
        with ws:
            while data := os.read(0, 65536):
                ws.send(data)

    threading.Thread(target=upload, daemon=True).start()
    try:
        for message in ws:
            os.write(1, message if isinstance(message, bytes) else message.encode())
    except ConnectionClosed:
        pass


@app.command("ssh-config")
def ssh_config(env_id: Annotated[str, typer.Argument(help=ID_HELP)]) -> None:
    """A `Host` block for ~/.ssh/config (then `ssh sxwl-NAME`, or VS Code Remote-SSH)."""
    env = env_by_id(env_id)
    lines = [f"Host sxwl-{env['name']}", f"  HostName {env['id']}", f"  User {SSH_USER}"]
    print("\n".join([*lines, f"  ProxyCommand {proxy_command(env['id'])}"]))


@app.command("ssh", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def ssh(ctx: typer.Context, env_id: Annotated[str, typer.Argument(help=ID_HELP)]) -> None:
    """An SSH session in the environment (`sxwl dev ssh ID -- COMMAND` runs one command)."""
    env = env_by_id(env_id)
    program = shutil.which("ssh")
    if program is None:
        raise CliError("no `ssh` on this machine: install OpenSSH's client")
    extra = [a for a in ctx.args if a != "--"]
    os.execv(  # noqa: S606 - the user's own ssh, with their arguments, in place of this process
        program,
        [program, "-o", f"ProxyCommand={proxy_command(env['id'])}", f"{SSH_USER}@{env['id']}", *extra],
    )


@keys_app.command("add")
def add_key(
    file: Annotated[Path, typer.Argument(help="A public key file, e.g. ~/.ssh/id_ed25519.pub.")],
    name: Annotated[str, typer.Option("--name", help="A name for it (default: its comment).")] = "",
) -> None:
    """Add a public key to your account."""
    try:
        text = file.read_text()
    except OSError as exc:
        raise CliError(f"{file}: {exc.strerror}", exit_code=2) from None
    try:
        key = client.call("POST", "/api/v1/me/ssh-keys", json={"name": name, "public_key": text}).json()
    except client.ApiError as exc:
        raise CliError(f"{file}: {exc}", exit_code=2 if exc.status == 422 else 1) from None
    out.print(f"added [bold]{key['id']}[/] {escape(key['name'])} {key['fingerprint']}")


@keys_app.command("list")
def list_keys() -> None:
    """Your SSH public keys."""
    table = listing("id", "name", "fingerprint", "added")
    for key in client.call("GET", "/api/v1/me/ssh-keys").json():
        table.add_row(
            key["id"], escape(key["name"]), key["fingerprint"], key["created_at"][:19].replace("T", " ")
        )
    show(table)


@keys_app.command("remove")
def remove_key(key_id: Annotated[str, typer.Argument(help="Key id.")]) -> None:
    """Remove a key: environments started after this no longer accept it."""
    client.call("DELETE", f"/api/v1/me/ssh-keys/{key_id}")
    out.print(f"removed {key_id}")
