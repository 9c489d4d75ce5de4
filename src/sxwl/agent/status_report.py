"""What the agent tells the cloud of an attempt's state: its reason as the cloud's code and its
English together (protocol/reasons.py), so that the cloud words it for each reader and an older
cloud still has the English."""

from __future__ import annotations

from sxwl.protocol import AgentJobState, JobStatus
from sxwl.protocol.models import REASON_MAX_CHARS
from sxwl.protocol.reasons import TEXT, Reason, english


class Refusal(RuntimeError):
    """A runtime's refusal to start an attempt, with its reason as a code (protocol/reasons.py)."""

    def __init__(self, reason: Reason) -> None:
        super().__init__(english(reason))
        self.reason = reason


def could_not_start(error: Exception) -> str:
    why = error.reason if isinstance(error, Refusal) else str(error)
    return Reason.of("agent.could_not_start", error=why).stored


def status(attempt: int, state: AgentJobState, exit_code: int | None, reason: str | None) -> JobStatus:
    """A report of the attempt's state. A runtime keeps its reason as words or as a stored code
    (protocol/reasons.py): a code goes with its English, so that the cloud words it for each reader
    and an older cloud still has the English. A parameter that is a reason itself (a failed rank's
    cause) travels in ``reason_parts``, which an older cloud ignores (it then keeps the English)."""
    said = Reason.read(reason)
    words = english(said)
    if words is not None and len(words) > REASON_MAX_CHARS:  # several ranks' upload errors, say
        words = words[: REASON_MAX_CHARS - 1] + "…"
    given = said.params if said is not None and said.code != TEXT else {}
    params = {k: v for k, v in given.items() if v is None or isinstance(v, str | int)}
    parts = {k: v.stored_within(REASON_MAX_CHARS) for k, v in given.items() if isinstance(v, Reason)}
    coded = said is not None and said.code != TEXT and len(params) + len(parts) == len(said.params)
    return JobStatus(
        attempt=attempt,
        state=state,
        exit_code=exit_code,
        reason=words,
        reason_code=said.code if said and coded else None,
        reason_params=params if coded else None,
        reason_parts=parts if coded and parts else None,
    )
