"""Asks each running dev environment's JupyterLab, through its CPod's tunnel, whether it is in use,
and pauses those idle past their timeout (services/devenvs/idle.py). Every replica runs it; a pause
is a conditional change of the environment, so two replicas judging at once pause it once."""

from __future__ import annotations

import asyncio
import json
import logging

from sxwl.cloud.context import CloudContext
from sxwl.cloud.services.devenvs import idle
from sxwl.cloud.tunnel import service
from sxwl.cloud.tunnel.hub import NoTunnel
from sxwl.protocol.devenvs import base_url

log = logging.getLogger("sxwl.dev_envs")
ASK_TIMEOUT_S = 20.0


async def _ask(ctx: CloudContext, env: idle.Running) -> idle.Seen | None:
    """JupyterLab's /api/status (which does not itself count as activity); None when unreachable."""
    request = service.TunnelRequest(
        "GET", f"{base_url(env.env_id)}api/status", [("authorization", f"token {env.upstream.token}")]
    )
    try:
        async with asyncio.timeout(ASK_TIMEOUT_S):
            reply = await service.open_stream(ctx.tunnels, env.upstream.cpod_id, env.upstream.target, request)
            async with reply:
                body = await reply.read()
        if reply.status != 200:
            return None
        status = json.loads(body)
        return idle.Seen(
            env.env_id, env.job_id, int(status["connections"]), str(status["last_activity"])[:64]
        )
    except (NoTunnel, service.TunnelError, TimeoutError, ValueError, KeyError, TypeError):
        return None  # not known to be idle: asked again at the next check


async def run(ctx: CloudContext) -> None:
    while not ctx.notifier.stopping:
        try:
            envs = await asyncio.to_thread(idle.running, ctx)
            seen = [s for s in await asyncio.gather(*(_ask(ctx, env) for env in envs)) if s is not None]
            for env_id in await asyncio.to_thread(idle.judge, ctx, seen):
                log.info("dev environment %s idle: paused", env_id, extra={"event": "dev_env_idle"})
        except Exception:
            log.exception("idle check of dev environments failed")  # the next check tries again
        await asyncio.sleep(ctx.settings.dev_env_idle_check_s)
