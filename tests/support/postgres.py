"""A throwaway PostgreSQL cluster in a temp dir on a free loopback port (tests and benchmarks)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import psycopg

from tests.support.net import free_port


def _bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: run `make test-deps` (Debian's postgresql)")
    return Path(found[-1]).parent


class TempPostgres:
    def __init__(
        self, *, durable: bool = False, host: str = "127.0.0.1", clients: Sequence[str] = ()
    ) -> None:
        """``durable``: commits wait for the WAL to reach the disk, as in production (benchmarks);
        otherwise fsync is off, which tests do not need. ``host``: an address it listens on besides
        loopback, where the networks ``clients`` (CIDRs, e.g. test pods') log in with a password."""
        self.durable = durable
        self.host, self.clients = host, tuple(clients)
        self.bin = _bin_dir()
        self.root = Path(tempfile.mkdtemp(prefix="sxwl-pg-"))
        self.data = self.root / "data"
        self.port = free_port(host)
        # initdb refuses to run as root: run the server as the postgres user the package created.
        self.run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self._counter = 0

    def _run(self, *args: str) -> None:
        subprocess.run([*self.run_as, *args], check=True, capture_output=True, timeout=120)

    def start(self) -> TempPostgres:
        if self.run_as:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"
        )
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.writelines(f"host all all {network} scram-sha-256\n" for network in self.clients)
        return self.resume()

    def resume(self) -> TempPostgres:
        """Starts the server (again, after `halt()`) on the same data and port."""
        listen = ",".join(dict.fromkeys(["127.0.0.1", self.host]))
        options = f"-p {self.port} -k {self.root} -c listen_addresses={listen} -c max_connections=200"
        if not self.durable:
            options += " -c fsync=off"
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.root / "log"),
            "-w",
            "start",
        )
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; returns its URL."""
        self._counter += 1
        name = f"t{os.getpid()}_{self._counter}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def halt(self) -> None:
        """Stops the server and keeps its data: clients see their database go away."""
        subprocess.run(
            [*self.run_as, str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"],
            capture_output=True,
            timeout=60,
            check=False,
        )

    def stop(self) -> None:
        self.halt()
        shutil.rmtree(self.root, ignore_errors=True)
