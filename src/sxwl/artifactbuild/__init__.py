"""``make artifact``: builds the offline artifact ``dist/3k-artifact.tgz`` (docs/artifact.md) from
pinned versions only, reproducibly. Build-machine code: nothing of the cloud, agent or 3kctl imports
it, and it is not part of 3kctl's zipapp."""
