"""Dev environments (docs/dev-envs.md): JupyterLab on a CPod's GPUs, reached through the agent's
tunnel. An environment is a row of its own whose current job, of the ``dev-env`` kind, runs on the
same scheduler, sandbox, fencing and billing as every job."""
