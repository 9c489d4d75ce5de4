"""3kctl: turns a provider's hosts into a CPod of 算想云 (config, SSH, preflight, deploy, Ceph).

This package imports nothing from the cloud, the agent or pydantic, so that it can travel as a
self-contained zipapp at the root of the offline artifact."""
