"""What a CPod's agent calls, authenticated by its CPod token: registration, heartbeats, the
assignment long-poll, job status, logs, inputs and artifact uploads."""
