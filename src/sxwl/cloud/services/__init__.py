"""Business logic of the cloud, free of HTTP and FastAPI: routers, the console, the background
loops and the CLI call these functions, and only these touch the models. The workload kinds built on
jobs are installed here, so every process that runs services runs their hooks
(services/job_kinds.py); the jobs modules themselves name no kind."""

from sxwl.cloud.services import job_kinds
from sxwl.cloud.services.fine_tune_kind import FINE_TUNE

job_kinds.register(FINE_TUNE)
