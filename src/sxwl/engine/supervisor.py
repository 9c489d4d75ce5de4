"""The engine's supervisor (see the package's docstring). Its log lines start ``::sxwl-engine::``;
the engine's own output passes through to the attempt's log, its last lines kept for the reason the
replica fails with once the engine exited more often than it may be started again."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections import deque
from pathlib import Path

from sxwl.engine.sockets import reachable
from sxwl.protocol.endpoints import EngineRun, vllm_argv

PREFIX = "::sxwl-engine:: "
FAILED_FILE = "engine-failed.json"  # what the agent reads for the replica's reason
TAIL_LINES = 20
STOP_GRACE_S = 10.0
RESTART_PAUSE_S = 1.0
EXIT_GAVE_UP = 3
MESSAGE_BYTES = 4000
RUN_ENV = "SXWL_ENGINE_RUN"  # the run itself, where no file holds it (a Kubernetes pod)


def say(message: str) -> None:
    sys.stdout.write(f"{PREFIX}{message}\n")
    sys.stdout.flush()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def prepared_model(run: EngineRun) -> Path:
    """The directory the engine loads: the base's, or for ``transformers serve`` with an adapter the
    two merged into the work dir (once; a restart finds it)."""
    model = Path(run.model_dir)
    if run.adapter_dir is None or run.engine == "vllm":
        return model
    merged = Path(run.work_dir) / "merged-model"
    if not merged.exists():
        say("merging the adapter into its base model")
        subprocess.run(
            [sys.executable, "-m", "sxwl.engine.merge", str(model), run.adapter_dir, str(merged)], check=True
        )
    return merged


def engine_argv(run: EngineRun, port: int) -> tuple[list[str], Path]:
    """The engine's command and the directory it runs in. ``transformers serve`` serves the model
    it is pinned to under the id it was given, so it is given the endpoint's name, a link in its
    directory to the model: requests carry that name, as they do to vLLM."""
    if run.engine == "vllm":
        return vllm_argv(run.model_copy(update={"port": port})), Path(run.work_dir)
    served = Path(run.work_dir) / "served"
    served.mkdir(exist_ok=True)
    link = served / run.served_name
    if not link.is_symlink():
        link.symlink_to(prepared_model(run))
    argv = [sys.executable, "-m", "transformers.cli.transformers", "serve", run.served_name]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu" if run.gpus == 0 else "auto"]
    if isinstance(dtype := run.engine_args.get("dtype"), str):
        argv += ["--dtype", dtype]
    return argv, served


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await source.read(256 * 1024):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()


async def _bridge(port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One connection of the agent's to the engine's port, bytes both ways until either closes."""
    try:
        engine_reader, engine_writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        writer.transport.abort()  # the engine is not up (yet): the agent sees a closed connection
        return
    try:
        await asyncio.gather(_pipe(reader, engine_writer), _pipe(engine_reader, writer))
    finally:
        engine_writer.transport.abort()
        writer.transport.abort()


async def _copy_lines(output: asyncio.StreamReader, tail: deque[str]) -> None:
    while line := await output.readline():
        sys.stdout.buffer.write(line)
        sys.stdout.flush()
        tail.append(line.decode("utf-8", "replace").rstrip()[:500])


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


def write_failed(run: EngineRun, exits: int, status: int | None, lines: list[str]) -> None:
    """On Kubernetes the file is also the pod's termination message, of which the kubelet keeps 4096
    bytes: the oldest lines go until it fits, so it stays whole JSON."""
    said = json.dumps({"exits": exits, "status": status, "lines": lines})
    while len(said.encode()) > MESSAGE_BYTES and lines:
        lines = lines[1:]
        said = json.dumps({"exits": exits, "status": status, "lines": lines})
    Path(run.work_dir, FAILED_FILE).write_text(said)


async def _listen(run: EngineRun, port: int) -> asyncio.Server:
    """The agent's way in: a TCP port on the pod's address (Kubernetes), or a 0600 unix socket."""
    if run.listen_port is not None:
        return await asyncio.start_server(lambda r, w: _bridge(port, r, w), port=run.listen_port)
    assert run.socket is not None
    with contextlib.suppress(FileNotFoundError):
        os.unlink(run.socket)
    with reachable(run.socket) as path:
        server = await asyncio.start_unix_server(lambda r, w: _bridge(port, r, w), path=path)
        os.chmod(path, 0o600)  # the attempt's uid (and the agent, root or the same uid) only
    return server


async def supervise(run: EngineRun, port: int, argv: list[str], cwd: Path) -> int:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    server = await _listen(run, port)
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    exits = 0
    try:
        while True:
            say(f"starting the engine: {' '.join(argv)}")
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            assert proc.stdout is not None
            copying = asyncio.create_task(_copy_lines(proc.stdout, tail))
            ended, stop = asyncio.create_task(proc.wait()), asyncio.create_task(stopping.wait())
            await asyncio.wait({ended, stop}, return_when=asyncio.FIRST_COMPLETED)
            if stopping.is_set():
                await _stop(proc)
                ended.cancel()
                say("stopped")
                return 0
            stop.cancel()
            await copying
            exits += 1
            if exits > run.restarts:
                write_failed(run, exits, proc.returncode, list(tail))
                say(f"the engine exited {exits} times (last status {proc.returncode}); giving up")
                return EXIT_GAVE_UP
            say(
                f"the engine exited with status {proc.returncode}; starting it again ({exits}/{run.restarts})"
            )
            await asyncio.sleep(RESTART_PAUSE_S)
    finally:
        server.close()


def main(argv: list[str]) -> int:
    if len(argv) > 1 or (not argv and RUN_ENV not in os.environ):
        sys.stderr.write(f"usage: python -m sxwl.engine RUN.json (or the run in ${RUN_ENV})\n")
        return 2
    run = EngineRun.model_validate_json(Path(argv[0]).read_text() if argv else os.environ[RUN_ENV])
    port = run.port or free_port()  # 0: a loopback shared with other work (no own namespace)
    command, cwd = engine_argv(run, port)
    return asyncio.run(supervise(run, port, command, cwd))
