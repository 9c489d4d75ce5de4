"""Dev environments as their owners see them (docs/dev-envs.md): create, list, look, stop. The
environment's JupyterLab itself is served by the console's proxy at /dev/{id}/ (web/devenvs/)."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel
from sqlalchemy.orm import Session

from sxwl.cloud.api.deps import Ctx, CurrentUser
from sxwl.cloud.api.responses import SIGNED_IN, WITH_BODY, errors
from sxwl.cloud.db.devenv_models import DevEnv
from sxwl.cloud.db.models import Job
from sxwl.cloud.services.devenvs import dev_envs, storage
from sxwl.cloud.services.money import billing
from sxwl.protocol.devenvs import DevEnvIn, base_url
from sxwl.protocol.reasons import english

router = APIRouter(prefix="/dev-envs", tags=["dev-envs"], responses=SIGNED_IN)
NOT_FOUND = errors(404)


class MountOut(BaseModel):
    kind: str  # "model" | "file"
    name: str
    path: str  # where it is, read-only, inside the environment


class DevEnvOut(BaseModel):
    id: str
    name: str
    status: dev_envs.Status
    reason: str | None
    gpu_product: str | None
    gpus: int
    cpus: int | None  # cores it asked for (None: a job's defaults; billed as 1 without GPUs)
    memory_gib: int | None
    image: str | None
    mounts: list[MountOut]
    idle_timeout_min: int
    url: str  # JupyterLab, on this cloud, for the owner's console session
    job_id: str | None
    cpod_id: str | None
    created_at: datetime
    started_at: datetime | None
    stopped_at: datetime | None
    cost: int  # micro-yuan so far, billed while it runs
    cost_per_hour: int
    saved_workspace_bytes: int | None  # its workspace as last saved to the artifact store
    storage_cost: int  # micro-yuan its saved workspace has cost so far (the storage price per GiB-day)


def env_outs(session: Session, rows: list[tuple[DevEnv, Job | None]]) -> list[DevEnvOut]:
    costs = billing.job_costs(session, [job.id for _, job in rows if job is not None])
    kept = storage.totals(session, [env.id for env, _ in rows])
    outs = []
    for env, job in rows:
        cost = costs.get(job.id) if job is not None else None
        outs.append(
            DevEnvOut(
                id=env.id,
                name=env.name,
                status=dev_envs.status(env, job),
                reason=english(env.reason or (job.reason if job is not None else None)),
                gpu_product=env.gpu_product,
                gpus=env.gpus,
                cpus=env.cpus,
                memory_gib=env.memory_gib,
                image=env.image,
                mounts=[MountOut(**mount) for mount in env.mounts],
                idle_timeout_min=env.idle_timeout_min,
                url=base_url(env.id),
                job_id=env.job_id,
                cpod_id=(job.cpod_id if job is not None else None) or env.cpod_id,
                created_at=env.created_at,
                started_at=job.started_at if job is not None else None,
                stopped_at=env.stopped_at,
                cost=cost.cost if cost else 0,
                cost_per_hour=cost.per_hour if cost else 0,
                saved_workspace_bytes=env.saved["size"] if env.saved else None,
                storage_cost=kept.get(env.id, 0),
            )
        )
    return outs


@router.post("", status_code=201, response_model=DevEnvOut, responses=WITH_BODY | errors(402, 404, 409))
def create(body: DevEnvIn, user: CurrentUser, ctx: Ctx) -> DevEnvOut:
    with ctx.db.session() as session:
        env, job = dev_envs.create(ctx, session, owner=session.merge(user), request=body)
        (out,) = env_outs(session, [(env, job)])
    return out


@router.get("", response_model=list[DevEnvOut])
def list_envs(user: CurrentUser, ctx: Ctx) -> list[DevEnvOut]:
    with ctx.db.session() as session:
        return env_outs(session, dev_envs.list_for(session, user))


@router.get("/{env_id}", response_model=DevEnvOut, responses=NOT_FOUND)
def get_env(env_id: str, user: CurrentUser, ctx: Ctx) -> DevEnvOut:
    with ctx.db.session() as session:
        (out,) = env_outs(session, [dev_envs.get_for(session, user, env_id)])
    return out


@router.delete("/{env_id}", response_model=DevEnvOut, responses=NOT_FOUND | errors(409))
def stop(env_id: str, user: CurrentUser, ctx: Ctx) -> DevEnvOut:
    with ctx.db.session() as session:
        (out,) = env_outs(session, [dev_envs.stop(session, session.merge(user), env_id)])
    return out


@router.post("/{env_id}/pause", response_model=DevEnvOut, responses=NOT_FOUND | errors(409))
def pause(env_id: str, user: CurrentUser, ctx: Ctx) -> DevEnvOut:
    with ctx.db.session() as session:
        owner = session.merge(user)
        found = dev_envs.pause(session, owner, env_id, dev_envs.paused_by(owner))
        (out,) = env_outs(session, [found])
    return out


@router.post("/{env_id}/resume", response_model=DevEnvOut, responses=NOT_FOUND | errors(402, 409))
def resume(env_id: str, user: CurrentUser, ctx: Ctx) -> DevEnvOut:
    with ctx.db.session() as session:
        (out,) = env_outs(session, [dev_envs.resume(ctx, session, session.merge(user), env_id)])
    return out
