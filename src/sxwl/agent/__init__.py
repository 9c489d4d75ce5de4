"""sxwl-agent: registers a CPod with the cloud, reports its inventory, and (later) runs its jobs."""
