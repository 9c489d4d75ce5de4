"""Which started attempt's pods may read which entry of the CPod's input cache (cache_server.py),
by the credential derived from the attempt's upload token. In memory only: a restarted agent grants
nothing to earlier attempts, whose pods then fetch from the cloud."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from sxwl.agent.pod_fetcher import cache_credential


@dataclass(frozen=True)
class Grant:
    credential: str
    sha256s: frozenset[str]


class InputGrants:
    """Which attempt may read which of the cache's entries, by the attempt's derived credential."""

    def __init__(self) -> None:
        self._grants: dict[tuple[str, int], Grant] = {}

    def allow(self, job_id: str, attempt: int, upload_token: str, sha256s: frozenset[str]) -> None:
        self._grants[(job_id, attempt)] = Grant(cache_credential(upload_token), sha256s)

    def revoke(self, job_id: str, attempt: int) -> None:
        self._grants.pop((job_id, attempt), None)

    def permits(self, job_id: str, attempt: int, credential: str, sha256: str) -> bool:
        grant = self._grants.get((job_id, attempt))
        if grant is None:
            return False
        # Compared whole and in constant time before the sha256 is looked at.
        return hmac.compare_digest(grant.credential, credential) and sha256 in grant.sha256s
