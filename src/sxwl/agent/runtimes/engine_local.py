"""An endpoint replica's engine on the local runtime (docs/endpoints.md, "Engines"): the run file of
the engine's supervisor (``python -m sxwl.engine``) and where its socket is.

The engine listens on the loopback of the attempt's own network namespace (the sandbox's
``--unshare-net``): nothing on the machine can connect to it. The supervisor also serves a unix
socket in the attempt's work dir, mode 0600, below the agent's state dir (0700): only the agent (root,
or the attempt's own uid) and the attempt reach it, and the agent forwards to it only the tunnel's
streams the cloud opened for this attempt. Without isolation (no own namespace) the engine takes a
free loopback port, which other local processes could reach: such a CPod takes only its provider's
and trusted accounts' work."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sxwl.agent.runtimes.sandbox_mounts import SandboxPaths
from sxwl.protocol.endpoints import ENGINE_PORT, ENGINE_SOCKET, EngineRun, EngineSpec

ENGINE_RUN_FILE = "engine-run.json"


def engine_command(
    spec: EngineSpec, placed: Path, paths: SandboxPaths, isolated: bool, gpus: int
) -> tuple[list[str], Path]:
    """Writes the ``EngineRun`` (every path as the attempt sees it) into the work dir; returns the
    supervisor's command and the socket's path on this machine."""

    def seen(path: Path) -> str:
        return str(paths.inside(path) if isolated else path)

    if not (placed / "model").is_dir():
        raise RuntimeError("an endpoint needs the input model")
    if spec.adapter and not (placed / "adapter").is_dir():
        raise RuntimeError("an endpoint of a fine-tuned model needs the input adapter")
    socket = paths.work / ENGINE_SOCKET
    run = EngineRun(
        **spec.model_dump(),
        engine="vllm" if gpus > 0 else "transformers",
        model_dir=seen(placed / "model"),
        adapter_dir=seen(placed / "adapter") if spec.adapter else None,
        socket=seen(socket),
        work_dir=seen(paths.work),
        port=ENGINE_PORT if isolated else 0,
        gpus=gpus,
    )
    run_file = paths.work / ENGINE_RUN_FILE
    run_file.write_text(run.model_dump_json())
    os.chmod(run_file, 0o444)
    return [sys.executable, "-m", "sxwl.engine", seen(run_file)], socket
