"""A real S3-compatible server for the artifact-store tests: SeaweedFS's `weed mini` (master, volume,
filer and S3 gateway in one process) on loopback, with an S3 identity whose keys the tests hold and
one bucket. `make seaweedfs-bin` (scripts/seaweedfs-bin.sh) builds the binary."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import boto3
from botocore.config import Config
from types_boto3_s3 import S3Client

from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[2]
BIN_SCRIPT = ROOT / "scripts" / "seaweedfs-bin.sh"
ACCESS_KEY = "sxwltestaccesskey"
SECRET_KEY = "sxwl-test-secret-key-0123456789"  # a throwaway test server's
BUCKET = "sxwl-artifacts"


def weed_binary() -> Path:
    out = subprocess.run(
        ["bash", str(BIN_SCRIPT), "--print-bin-dir"], capture_output=True, text=True, check=True, timeout=30
    )
    binary = Path(out.stdout.strip()) / "weed"
    if not os.access(binary, os.X_OK):
        raise RuntimeError(
            f"SeaweedFS missing at {binary}: run `make seaweedfs-bin` (scripts/seaweedfs-bin.sh builds it "
            "from its Go module; see docs/object-storage.md)"
        )
    return binary


# What weed writes when one of its ports is not free: its own check before it starts, or a fatal
# ("F…") bind. Its warning about a legacy admin port that another weed holds is harmless.
PORT_CHECK_FAILED = b"Port allocation failed"
BIND_FAILED = b"address already in use"


class PortTaken(RuntimeError):
    pass


def _port_taken(log: Path, since: int) -> bool:
    with log.open("rb") as handle:
        handle.seek(since)
        lines = handle.read().splitlines()
    return any(PORT_CHECK_FAILED in line or (line.startswith(b"F") and BIND_FAILED in line) for line in lines)


class SeaweedFS:
    """Started once; ``stop`` and ``start`` again keep its ports and data (a store that went away)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.binary = weed_binary()
        self._pick_ports()
        self.process: subprocess.Popen[bytes] | None = None
        (workdir / "data").mkdir(parents=True, exist_ok=True)
        self.config = workdir / "s3.json"
        identity = {
            "name": "sxwl",
            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        self.config.write_text(json.dumps({"identities": [identity]}))
        self.config.chmod(0o600)

    def _pick_ports(self) -> None:
        # gRPC ports too: their default (HTTP port + 10000) may be taken on a shared machine.
        names = ("master", "volume", "filer", "s3")
        self.ports = {f"{name}.port{kind}": free_port() for name in names for kind in ("", ".grpc")}
        self.endpoint = f"http://127.0.0.1:{self.ports['s3.port']}"

    def start_first(self, tries: int = 3) -> None:
        """The first start. free_port's ports come from the kernel's ephemeral range, which every
        outgoing connection of a busy test run draws its source port from too: when one was taken
        before weed could bind it, new ports are tried (no client knows the old ones yet)."""
        for attempt in range(1, tries + 1):
            try:
                self.start()
                return
            except PortTaken:
                if attempt == tries:
                    raise
                self._pick_ports()

    def command(self) -> list[str]:
        return [
            str(self.binary),
            f"-logdir={self.workdir}",  # its own log files, not in /tmp where they would outlive the test
            "mini",
            f"-dir={self.workdir / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            *(f"-{flag}={port}" for flag, port in self.ports.items()),
            f"-s3.config={self.config}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            f"-bucket={BUCKET}",
        ]

    def start(self, timeout_s: float = 90) -> None:
        log_path = self.workdir / "weed.log"
        seen = log_path.stat().st_size if log_path.exists() else 0
        log = log_path.open("ab")
        self.process = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir, start_new_session=True
        )
        log.close()
        client = self.client()
        deadline = time.monotonic() + timeout_s
        while True:
            if _port_taken(log_path, seen):
                self.stop()  # it may wait on for a port it will never have
                raise PortTaken(f"a port of SeaweedFS was taken; see {log_path}")
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"weed mini exited ({self.process.returncode}); see {self.workdir / 'weed.log'}"
                )
            try:
                client.head_bucket(Bucket=BUCKET)
                return
            except Exception:  # not up yet, whatever the failure
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"SeaweedFS did not serve {BUCKET}; see {self.workdir / 'weed.log'}"
                    ) from None
                time.sleep(0.5)

    def stop(self) -> None:
        """By its pid (its own process group: weed mini's servers are goroutines of one process)."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def client(self) -> S3Client:
        client: S3Client = boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )
        return client

    def credentials_file(self, path: Path) -> Path:
        path.write_text(
            f"[default]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n"
        )
        path.chmod(0o600)
        return path
