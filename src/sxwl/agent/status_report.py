"""What the agent tells the cloud of an attempt's state: its reason as the cloud's code and its
English together (protocol/reasons.py), so that the cloud words it for each reader and an older
cloud still has the English."""

from __future__ import annotations

from sxwl.protocol import AgentJobState, JobStatus
from sxwl.protocol.models import REASON_MAX_CHARS
from sxwl.protocol.reasons import TEXT, Reason, english


def could_not_start(error: Exception) -> str:
    return Reason.of("agent.could_not_start", error=str(error)).stored


def status(attempt: int, state: AgentJobState, exit_code: int | None, reason: str | None) -> JobStatus:
    """A report of the attempt's state. A runtime keeps its reason as words or as a stored code
    (protocol/reasons.py): a code goes with its English, so that the cloud words it for each reader
    and an older cloud still has the English."""
    said = Reason.read(reason)
    words = english(said)
    if words is not None and len(words) > REASON_MAX_CHARS:  # several ranks' upload errors, say
        words = words[: REASON_MAX_CHARS - 1] + "…"
    params = {k: v for k, v in said.params.items() if v is None or isinstance(v, str | int)} if said else {}
    coded = said is not None and said.code != TEXT and len(params) == len(said.params)
    return JobStatus(
        attempt=attempt,
        state=state,
        exit_code=exit_code,
        reason=words,
        reason_code=said.code if said and coded else None,
        reason_params=params if coded else None,
    )
