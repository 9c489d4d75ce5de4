"""``sxwl serve --workers N``: N worker processes on one listening socket, each a full replica of
the cloud (its own event loop, background loops and database pool), kept running by this process.

Workers are spawned, not forked: each imports the cloud afresh, after PROMETHEUS_MULTIPROC_DIR is
set, so its counters and histograms go to the shared files that any worker's /metrics adds up
(docs/operations.md, "Several worker processes and metrics")."""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.context import SpawnProcess
from multiprocessing.synchronize import Event
from types import FrameType

from prometheus_client import multiprocess

from sxwl.cli.client import CliError
from sxwl.cloud.config import Settings

log = logging.getLogger("sxwl.supervisor")

# How long stopping workers may finish their requests (uvicorn's own grace is 5 s) before SIGKILL.
STOP_GRACE_S = 15.0
_CHECK_S = 0.5
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass(frozen=True)
class Worker:
    """What a worker process gets from the supervisor: its number (sent as the X-Sxwl-Worker header),
    the listening socket, and the event it sets once it serves."""

    index: int
    sockets: list[socket.socket]
    ready: Event
    supervisor: int  # pid

    def follow_supervisor(self) -> None:
        """Has the kernel send this worker SIGTERM when the supervisor dies, even by SIGKILL: a worker
        left behind would go on serving the port, unwatched and never restarted."""
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != self.supervisor:  # it died before the call above
            os.kill(os.getpid(), signal.SIGTERM)


WorkerMain = Callable[[Settings, str, int, Worker], None]


@dataclass
class _Running:
    process: SpawnProcess
    ready: Event


def listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise CliError(f"cannot listen on {host}:{port}: {error.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class Supervisor:
    def __init__(self, settings: Settings, host: str, port: int, workers: int, main: WorkerMain) -> None:
        self.settings = settings
        self.host = host
        self.port = port
        self.count = workers
        self.main = main
        self.context = multiprocessing.get_context("spawn")
        self.stop = threading.Event()

    def run(self) -> None:
        # A fresh private directory per start: files of an earlier run's workers would be added to
        # this run's counters.
        metrics_dir = tempfile.mkdtemp(prefix="sxwl-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
        sock = listening_socket(self.host, self.port)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        workers: list[_Running] = []
        try:
            workers = [self._start(index, sock) for index in range(self.count)]
            log.info("started %d workers", self.count, extra={"event": "workers_started"})
            while not self.stop.wait(_CHECK_S):
                for index, worker in enumerate(workers):
                    if not worker.process.is_alive():
                        workers[index] = self._replace(index, worker, sock)
        finally:
            self._stop_all(workers)
            sock.close()
            shutil.rmtree(metrics_dir, ignore_errors=True)

    def _on_signal(self, _sig: int, _frame: FrameType | None) -> None:
        self.stop.set()

    def _start(self, index: int, sock: socket.socket) -> _Running:
        ready = self.context.Event()
        process = self.context.Process(
            target=self.main,
            args=(self.settings, self.host, self.port, Worker(index, [sock], ready, os.getpid())),
            name=f"sxwl-worker-{index}",
        )
        process.start()
        return _Running(process, ready)

    def _replace(self, index: int, worker: _Running, sock: socket.socket) -> _Running:
        process = worker.process
        process.join()
        _forget(process)
        if not worker.ready.is_set():
            # It failed before serving (a bad setting, an unreachable database): every replacement
            # would fail the same way.
            raise CliError(f"worker {index} exited with {process.exitcode} before serving; see its log above")
        log.warning(
            "worker %d (pid %s) exited with %s; starting another",
            index,
            process.pid,
            process.exitcode,
            extra={"event": "worker_restarted"},
        )
        return self._start(index, sock)

    def _stop_all(self, workers: list[_Running]) -> None:
        for worker in workers:
            if worker.process.is_alive() and worker.process.pid is not None:
                os.kill(worker.process.pid, signal.SIGTERM)
        for worker in workers:
            worker.process.join(STOP_GRACE_S)
            if worker.process.is_alive():
                log.warning("worker pid %s did not stop in %g s: killed", worker.process.pid, STOP_GRACE_S)
                worker.process.kill()
                worker.process.join()
            _forget(worker.process)


def _forget(process: SpawnProcess) -> None:
    """Drops a dead worker's live gauges from the shared metric files (its counters stay counted)."""
    if process.pid is not None:
        multiprocess.mark_process_dead(process.pid)  # type: ignore[no-untyped-call]  # untyped upstream
