"""What ``JobSync`` needs of a runtime: the ``Runtime`` protocol and the per-attempt ``JobRecord``.

Every method JobSync calls between two awaits is synchronous and only touches the runtime's own
state; the I/O a runtime needs (the Kubernetes API, say) happens in ``refresh``, which JobSync awaits
once per supervision pass before ``poll``. The ``local`` runtime has nothing to do there."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal, Protocol, TypeVar

from sxwl.protocol import Assignment

Outcome = Literal["succeeded", "failed", "cancelled"]


class JobRecord(Protocol):
    """What a runtime keeps about one attempt, as far as JobSync reads and writes it."""

    job_id: str
    attempt: int
    log_offset: int  # bytes of the log file the cloud has acknowledged
    stop_reason: str | None  # why it ended other than by its own exit status (sent as the reason)
    outcome: Outcome | None
    exit_code: int | None
    reported_state: str | None
    fenced: bool
    artifacts_uploaded: list[str]

    @property
    def key(self) -> str: ...


J = TypeVar("J", bound=JobRecord)


class Runtime(Protocol[J]):
    """Where a CPod runs its jobs. ``jobs`` holds the attempts not yet reported final, by
    ``"<job_id>:<attempt>"``."""

    @property
    def jobs(self) -> Mapping[str, J]: ...

    def knows(self, job_id: str, attempt: int) -> bool:
        """This attempt was started here before (perhaps before a restart): never start it twice."""
        ...

    def start(self, assignment: Assignment) -> J:
        """Starts the attempt once; raises RuntimeError or OSError (with a reason for the cloud) when
        it cannot."""
        ...

    def stop(self, job_id: str, attempt: int, reason: str, cancel: bool) -> J | None: ...

    async def refresh(self) -> list[J]:
        """Does the runtime's I/O (create, delete, read status, collect logs); returns attempts found
        gone while the agent was away, to report as lost."""
        ...

    def poll(self) -> list[J]:
        """Records outcomes; returns the attempts that finished in this call."""
        ...

    def adopt(self) -> list[J]:
        """After a restart: takes back running attempts; returns the lost ones."""
        ...

    def save(self, job: J) -> None: ...

    def done(self, job: J) -> None:
        """The cloud has the final state: forget the attempt and release what it holds."""
        ...

    def log_path(self, job: J) -> Path:
        """A local file holding the attempt's output; JobSync ships it by offset."""
        ...

    def output_dir(self, job: J) -> Path | None:
        """Files to upload as artifacts when the attempt ends, or None when the runtime has none."""
        ...

    def used_gpu_count(self) -> int:
        """GPUs held by this runtime's attempts that have not ended."""
        ...
