"""The cloud's behaviour, one package per domain, free of HTTP: no FastAPI, no Request, no status
codes beyond the ``AppError`` a refusal raises (the edge renders it). Routers, pages, the background
loops and the CLI call these; only these touch the database models and the artifact store.

Domains, lowest first; a domain imports only itself and those before it (`make lint` checks,
scripts/check_layers.py): accounts, money, catalog, jobs, fleet, scheduling, finetune, endpoints, devenvs.

The workload kinds built on jobs are installed here, so that every process that runs services runs
their hooks (services/jobs/job_kinds.py); the jobs domain itself names no kind. So is the dev
environments' mover, which the scheduler asks whether a job pinned to a full CPod may go elsewhere
(services/scheduling/moves.py)."""

from sxwl.cloud.services.devenvs.dev_env_kind import DEV_ENV
from sxwl.cloud.services.devenvs.relocation import DEV_ENV_MOVER
from sxwl.cloud.services.endpoints.endpoint_kind import ENDPOINT
from sxwl.cloud.services.finetune.fine_tune_kind import FINE_TUNE
from sxwl.cloud.services.jobs import job_kinds
from sxwl.cloud.services.scheduling import moves

job_kinds.register(FINE_TUNE)
job_kinds.register(DEV_ENV)
job_kinds.register(ENDPOINT)
moves.register(DEV_ENV_MOVER)
