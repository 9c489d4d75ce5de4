"""SSH and preflight against real sshd processes on 127.0.0.x."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ctl.conftest import MakeHosts, run_ctl
from tests.ctl.hosts import config_text


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "conf" / "config-sample.conf"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def preflight_json(path: Path) -> tuple[int, dict[str, dict[str, dict[str, str]]], str]:
    result = run_ctl("preflight", "-f", str(path), "--json")
    data = json.loads(result.out)
    return result.rc, {h: v["checks"] for h, v in data["hosts"].items()}, result.err


def test_preflight_passes_on_good_hosts(tmp_path: Path, ssh_key: Path, make_hosts: MakeHosts) -> None:
    hosts = make_hosts(["master1", "worker1", "worker2"])
    path = write_config(tmp_path, config_text(hosts, ssh_key))
    result = run_ctl("preflight", "-f", str(path))
    assert result.rc == 0, result.text
    assert "all hosts ready (3 hosts" in result.out
    for name in ("master1", "worker1", "worker2", "reachable", "machine-id", "nvidia"):
        assert name in result.out
    # No NVIDIA driver on these machines: a warning on workers, not an error.
    assert "⚠ worker1 nvidia: no NVIDIA driver (nvidia-smi not found)" in result.out
    rc, checks, _ = preflight_json(path)
    assert rc == 0
    assert checks["master1"]["hostname"] == {"status": "ok", "detail": "master1", "fix": ""}
    assert checks["master1"]["nvidia"]["status"] == "skip"
    assert checks["worker1"]["nvidia"]["status"] == "warn"
    assert checks["worker2"]["modules"]["status"] == "ok"
    assert checks["master1"]["sudo"]["detail"] == "root"
    known = (path.parent / ".3kctl" / "known_hosts").read_text().splitlines()
    assert sorted(line.split()[0] for line in known) == sorted(f"[{h.address}]:{h.port}" for h in hosts)


def test_preflight_reports_each_problem_with_a_fix(
    tmp_path: Path, ssh_key: Path, make_hosts: MakeHosts
) -> None:
    good = make_hosts(["master1"])[0]
    no_module = make_hosts(["worker1"], modules=("overlay",))[0]
    twin = make_hosts(["worker2"], hostname="worker1", modules=("overlay", "br_netfilter"))[0]
    path = write_config(tmp_path, config_text([good, no_module, twin], ssh_key))
    rc, checks, _ = preflight_json(path)
    assert rc == 1
    assert checks["worker1"]["modules"]["status"] == "fail"
    assert "kernel lacks br_netfilter" in checks["worker1"]["modules"]["detail"]
    assert "modprobe br_netfilter" in checks["worker1"]["modules"]["fix"]
    assert checks["worker2"]["hostname"]["status"] == "fail"
    assert "the same as worker1" in checks["worker2"]["hostname"]["detail"]
    assert checks["master1"]["modules"]["status"] == "ok"
    table = run_ctl("preflight", "-f", str(path))
    assert table.rc == 1
    assert "✗ worker1 modules: kernel lacks br_netfilter" in table.out
    assert "    fix: install the kernel's module package" in table.out
    assert "problems to fix" in table.out


def test_unreachable_host_and_wrong_key(tmp_path: Path, ssh_key: Path, make_hosts: MakeHosts) -> None:
    up, down = make_hosts(["master1", "worker1"])
    down.stop()  # nothing listens on its address any more
    wrong = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
    text = config_text([up, down], ssh_key)
    path = write_config(tmp_path, text)
    rc, checks, _ = preflight_json(path)
    assert rc == 1
    assert checks["worker1"]["reachable"]["status"] == "fail"
    assert f"connection refused by {down.address}:{down.port}" in checks["worker1"]["reachable"]["detail"]
    assert checks["worker1"]["os"]["status"] == "skip"
    assert checks["master1"]["reachable"]["status"] == "ok"

    down.start()
    path = write_config(
        tmp_path, text.replace(f"privateKeyPath: {ssh_key}}}", f"privateKeyPath: {wrong}}}", 1)
    )
    rc, checks, _ = preflight_json(path)
    assert rc == 1
    detail = checks["master1"]["reachable"]["detail"]
    assert f"root@{up.address}:{up.port} refused the key {wrong}" in detail
    assert "run `3kctl ssh setup`" in detail


def test_unanswering_address_times_out(tmp_path: Path, ssh_key: Path, make_hosts: MakeHosts) -> None:
    host = make_hosts(["master1"])[0]
    # A listening socket that never speaks SSH: the connect timeout must end the wait.
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    port = silent.getsockname()[1]
    text = config_text([host], ssh_key).replace(
        f"internalAddress: {host.address}, port: {host.port}", f"internalAddress: 127.0.0.1, port: {port}"
    )
    path = write_config(tmp_path, text)
    result = run_ctl("preflight", "-f", str(path), "--json", "--connect-timeout", "1")
    silent.close()
    assert result.rc == 1
    detail = json.loads(result.out)["hosts"]["master1"]["checks"]["reachable"]["detail"]
    assert detail.startswith("unreachable: no SSH answer from 127.0.0.1")


def test_changed_host_key_is_refused(tmp_path: Path, ssh_key: Path, make_hosts: MakeHosts) -> None:
    host = make_hosts(["master1"])[0]
    path = write_config(tmp_path, config_text([host], ssh_key))
    assert preflight_json(path)[0] == 0
    known = path.parent / ".3kctl" / "known_hosts"
    recorded = known.read_text()
    host.new_host_key()
    rc, checks, _ = preflight_json(path)
    assert rc == 1
    detail = checks["master1"]["reachable"]["detail"]
    assert detail.startswith(f"HOST KEY CHANGED for master1 ({host.address}:{host.port}): recorded SHA256:")
    assert f"(line 1 of {known})" in detail
    assert "delete its line" in checks["master1"]["reachable"]["fix"]
    assert known.read_text() == recorded  # the new key was not trusted


@pytest.fixture
def test_user() -> Iterator[tuple[str, str]]:
    """A local account with a password and passwordless sudo (for password SSH and sudo checks)."""
    if os.geteuid() != 0:
        pytest.skip("creating a user with a password for sshd needs root")
    name = "sxwl" + secrets.token_hex(4)
    password = "pw-" + secrets.token_hex(8)
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True)
    subprocess.run(["chpasswd"], input=f"{name}:{password}\n", text=True, check=True)
    sudoers = Path(f"/etc/sudoers.d/{name}")
    sudoers.write_text(f"{name} ALL=(ALL) NOPASSWD: ALL\n")
    sudoers.chmod(0o440)
    try:
        yield name, password
    finally:
        sudoers.unlink(missing_ok=True)
        subprocess.run(["userdel", "-r", name], check=False, capture_output=True)


def test_ssh_setup_with_a_password(tmp_path: Path, make_hosts: MakeHosts, test_user: tuple[str, str]) -> None:
    user, password = test_user
    hosts = make_hosts(["master1", "worker1"], authorized_key=None, password_auth=True)
    key = tmp_path / "keys" / "id_rsa"  # does not exist yet: ssh setup creates it
    path = write_config(tmp_path, config_text(hosts, key, user=user))
    invalid = run_ctl("check", "config", "-f", str(path))
    assert invalid.rc == 2 and "run `3kctl ssh setup` to create it" in invalid.err

    result = run_ctl("ssh", "setup", "-f", str(path), "--password-stdin", input=password + "\n")
    assert result.rc == 0, result.text
    assert f"created key pair {key}" in result.out
    assert result.out.count("✓ installed") == 2
    assert key.stat().st_mode & 0o777 == 0o600
    assert key.read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    public = key.with_name("id_rsa.pub").read_text().strip()
    assert public.startswith("ssh-rsa ")
    home = Path(pwd.getpwnam(user).pw_dir)
    # Both loopback hosts are this one machine, so both sessions appended to the same file.
    assert set((home / ".ssh" / "authorized_keys").read_text().splitlines()) == {public}

    again = run_ctl("ssh", "setup", "-f", str(path))  # no password needed any more
    assert again.rc == 0, again.text
    assert again.out.count("already trusted") == 2
    assert set((home / ".ssh" / "authorized_keys").read_text().splitlines()) == {public}

    # A non-root user works through sudo; the password appears nowhere 3kctl wrote.
    _, checks, _ = preflight_json(path)
    assert checks["master1"]["sudo"] == {"status": "ok", "detail": f"{user} may sudo", "fix": ""}
    for written in (path.parent / ".3kctl").rglob("*"):
        if written.is_file():
            assert password not in written.read_text()
    assert password not in result.text + again.text


def test_ssh_setup_with_a_wrong_password(
    tmp_path: Path, make_hosts: MakeHosts, test_user: tuple[str, str]
) -> None:
    user, _ = test_user
    host = make_hosts(["master1"], authorized_key=None, password_auth=True)[0]
    key = tmp_path / "keys" / "id_ed25519"
    path = write_config(tmp_path, config_text([host], key, user=user))
    result = run_ctl("ssh", "setup", "-f", str(path), "--password-stdin", input="not-the-password\n")
    assert result.rc == 1
    assert f"{user}@{host.address}:{host.port} refused the password" in result.out
    assert "ssh setup failed on 1 of 1 hosts" in result.err
