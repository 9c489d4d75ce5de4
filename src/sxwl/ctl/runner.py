"""One interface for the programs deploy steps run on this machine (kk, helm, kubectl).

``LocalRunner`` runs them for real. Two recorded fakes stand in where the real program cannot run
here, each selected only by an environment variable that tests set:

- ``SXWL_3KCTL_FAKE_KK=<dir>``: ``FakeKubeKey`` (KubeKey turns bare metal into Kubernetes, which no
  test machine allows). It records every argv in ``<dir>/kk-calls.jsonl``, copies the cluster file
  it is given to ``<dir>/cluster-<n>.yaml``, and on ``create cluster`` leaves ``<dir>/admin.conf``
  (a copy of ``SXWL_3KCTL_FAKE_KK_KUBECONFIG`` when set) where the kubeconfig step fetches it over
  SSH. ``SXWL_3KCTL_FAKE_KK_FAIL="create cluster"`` makes that sub-command fail, and
  ``SXWL_3KCTL_FAKE_KK_SLEEP="create cluster=30"`` makes it take 30 s (to interrupt it).
- ``SXWL_3KCTL_FAKE_KUBE=<dir>``: ``RecordedKube`` for helm and kubectl, in the tests that need no
  cluster (tests/ctl/test_deploy_k8s.py runs the real ones against the test control plane of
  tests/support/k8s.py). Records to ``<dir>/kube-calls.jsonl``; answers from ``<dir>/responses.json``
  (a list of ``{"match": "substring of the command line", "stdout": "...", "rc": 0}``, first match
  wins), else rc 0 and empty output.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TextIO

FAKE_KK_ENV = "SXWL_3KCTL_FAKE_KK"
FAKE_KK_FAIL_ENV = "SXWL_3KCTL_FAKE_KK_FAIL"
FAKE_KK_KUBECONFIG_ENV = "SXWL_3KCTL_FAKE_KK_KUBECONFIG"
FAKE_KK_SLEEP_ENV = "SXWL_3KCTL_FAKE_KK_SLEEP"
FAKE_KUBE_ENV = "SXWL_3KCTL_FAKE_KUBE"


@dataclass
class Command:
    argv: list[str]
    stdin: str | None = field(default=None, repr=False)
    shown_stdin: str | None = None  # what plans and logs show instead of stdin (secrets redacted)
    timeout: float | None = None

    def display(self) -> str:
        text = shlex.join(self.argv)
        if self.stdin is not None:
            body = self.shown_stdin if self.shown_stdin is not None else self.stdin
            text += " <<'EOF'\n" + body.rstrip("\n") + "\nEOF"
        return text


@dataclass
class Outcome:
    rc: int
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def tail(self, lines: int = 5) -> str:
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return "\n".join(text[-lines:]) if text else f"exit status {self.rc}, no output"


class Runner(Protocol):
    name: str

    def run(self, command: Command, log: TextIO) -> Outcome: ...


def _log_command(log: TextIO, command: Command) -> None:
    log.write(f"$ {command.display()}\n")
    log.flush()


class LocalRunner:
    """Runs the program on this machine, copying its output to the step's log as it comes."""

    name = "local"

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = env

    def run(self, command: Command, log: TextIO) -> Outcome:
        _log_command(log, command)
        env = {**os.environ, **(self.env or {})}
        try:
            proc = subprocess.Popen(
                command.argv,
                stdin=subprocess.PIPE if command.stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        except FileNotFoundError:
            message = f"{command.argv[0]}: program not found"
            log.write(message + "\n")
            return Outcome(127, "", message)
        out: list[str] = []
        err: list[str] = []

        def pump(stream: TextIO | None, into: list[str], prefix: str) -> None:
            assert stream is not None
            for line in stream:
                into.append(line)
                log.write(prefix + line)
                log.flush()

        threads = [
            threading.Thread(target=pump, args=(proc.stdout, out, ""), daemon=True),
            threading.Thread(target=pump, args=(proc.stderr, err, "stderr: "), daemon=True),
        ]
        for thread in threads:
            thread.start()
        if command.stdin is not None and proc.stdin is not None:
            proc.stdin.write(command.stdin)
            proc.stdin.close()
        try:
            rc = proc.wait(command.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
            err.append(f"timed out after {command.timeout:g}s\n")
        for thread in threads:
            thread.join()
        log.write(f"[exit {rc}]\n")
        return Outcome(rc, "".join(out), "".join(err))


def _append_json(path: Path, record: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(json.dumps(record, ensure_ascii=False) + "\n")


class FakeKubeKey:
    """A recorded stand-in for KubeKey (``kk``); see the module doc."""

    name = "fake-kubekey"

    def __init__(self, record_dir: Path) -> None:
        self.dir = record_dir
        self.dir.mkdir(parents=True, exist_ok=True)

    @property
    def admin_conf(self) -> Path:
        return self.dir / "admin.conf"

    def run(self, command: Command, log: TextIO) -> Outcome:
        _log_command(log, command)
        argv = command.argv
        words = [a for a in argv[1:] if not a.startswith("-")]
        sub = " ".join(words[:2])
        record: dict[str, object] = {"argv": argv, "at": time.time()}
        if "-f" in argv:
            source = Path(argv[argv.index("-f") + 1])
            calls = (
                len((self.dir / "kk-calls.jsonl").read_text().splitlines())
                if (self.dir / "kk-calls.jsonl").exists()
                else 0
            )
            copy = self.dir / f"cluster-{calls + 1}.yaml"
            shutil.copyfile(source, copy)
            record["cluster_file"] = copy.name
        _append_json(self.dir / "kk-calls.jsonl", record)
        slow, _, seconds = os.environ.get(FAKE_KK_SLEEP_ENV, "").partition("=")
        if slow and sub.startswith(slow):
            log.write(f"fake kk: `{sub}` sleeps {seconds}s\n")
            log.flush()
            time.sleep(float(seconds or 30))
        fail = os.environ.get(FAKE_KK_FAIL_ENV, "")
        if fail and sub.startswith(fail):
            message = f"fake kk: `{sub}` fails because {FAKE_KK_FAIL_ENV}={fail!r}\n"
            log.write(message)
            return Outcome(1, "", message)
        if sub == "create cluster":
            source_conf = os.environ.get(FAKE_KK_KUBECONFIG_ENV)
            if source_conf:
                shutil.copyfile(source_conf, self.admin_conf)
            else:
                self.admin_conf.write_text(PLACEHOLDER_KUBECONFIG)
            os.chmod(self.admin_conf, 0o600)
        message = f"fake kk: recorded `{shlex.join(argv[1:])}`\n"
        log.write(message)
        return Outcome(0, message, "")


PLACEHOLDER_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- cluster: {server: "https://lb.kubesphere.local:6443", insecure-skip-tls-verify: true}
  name: cluster.local
contexts:
- context: {cluster: cluster.local, user: kubernetes-admin}
  name: kubernetes-admin@cluster.local
current-context: kubernetes-admin@cluster.local
users:
- name: kubernetes-admin
  user: {token: fake-kubekey-placeholder}
"""


class RecordedKube:
    """A recorded stand-in for helm and kubectl; see the module doc."""

    name = "recorded-kube"

    def __init__(self, record_dir: Path) -> None:
        self.dir = record_dir
        self.dir.mkdir(parents=True, exist_ok=True)

    def run(self, command: Command, log: TextIO) -> Outcome:
        _log_command(log, command)
        _append_json(
            self.dir / "kube-calls.jsonl", {"argv": command.argv, "stdin": command.stdin, "at": time.time()}
        )
        line = shlex.join(command.argv)
        responses_path = self.dir / "responses.json"
        if responses_path.exists():
            for response in json.loads(responses_path.read_text()):
                if response["match"] in line:
                    outcome = Outcome(
                        int(response.get("rc", 0)), response.get("stdout", ""), response.get("stderr", "")
                    )
                    log.write(outcome.stdout + outcome.stderr)
                    return outcome
        return Outcome(0, "", "")


@dataclass
class Tools:
    """The programs of the cluster steps and where the kubeconfig comes from."""

    kk: Runner
    kube: Runner
    kk_path: str
    helm: str
    kubectl: str
    remote_admin_conf: str = "/etc/kubernetes/admin.conf"

    @property
    def fakes(self) -> list[str]:
        return [r.name for r in (self.kk, self.kube) if r.name != "local"]


def select_tools(artifact_root: Path | None) -> Tools:
    def tool(name: str) -> str:
        if artifact_root is not None and (artifact_root / "bin" / name).exists():
            return str(artifact_root / "bin" / name)
        return shutil.which(name) or name

    kk: Runner = LocalRunner()
    remote_admin_conf = "/etc/kubernetes/admin.conf"
    if record := os.environ.get(FAKE_KK_ENV):
        fake = FakeKubeKey(Path(record))
        kk, remote_admin_conf = fake, str(fake.admin_conf)
    kube: Runner = LocalRunner()
    if record := os.environ.get(FAKE_KUBE_ENV):
        kube = RecordedKube(Path(record))
    return Tools(
        kk=kk,
        kube=kube,
        kk_path=tool("kk"),
        helm=tool("helm"),
        kubectl=tool("kubectl"),
        remote_admin_conf=remote_admin_conf,
    )
