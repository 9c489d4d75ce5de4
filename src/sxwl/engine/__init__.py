"""An endpoint replica's engine under its supervisor (docs/endpoints.md): ``python -m sxwl.engine
RUN.json``, run by the agent inside the attempt's sandbox as the trainer is. It starts the engine
(vLLM with GPUs, ``transformers serve`` without) on the loopback of the attempt's own network
namespace, serves a unix socket in the attempt's work dir that leads to it (the agent's only way in),
and starts the engine again when it exits, a bounded number of times.

Imports nothing of ours but ``sxwl.protocol`` (it runs in the tenant's sandbox)."""
