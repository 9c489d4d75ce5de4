"""sxwl-agent, one per CPod: registers it with the cloud, reports its inventory in heartbeats,
long-polls for assignments and runs them on its runtime (runtimes/), shipping their status, logs
and artifacts back, fetching fine-tunes' inputs into its cache, and stopping work only when the
cloud says so (invariant 5, docs/architecture.md)."""
