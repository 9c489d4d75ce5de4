"""What the agent needs of a runtime: the ``Runtime`` protocol, the record every runtime keeps per
attempt (``AttemptRecord``) and where it keeps it (``AttemptDirs``).

Every method JobSync calls between two awaits is synchronous and only touches the runtime's own
state; the I/O a runtime needs (the Kubernetes API, say) happens in ``refresh``, which JobSync awaits
once per supervision pass before ``poll``. The ``local`` runtime has nothing to do there."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Generic, Literal, Protocol, TypeVar, runtime_checkable

from sxwl.agent.forward_targets import Target
from sxwl.agent.tenant_files import OutputTree
from sxwl.protocol import Assignment, Node, attempt_key

Outcome = Literal["succeeded", "failed", "cancelled"]
RECORD_FILE = "job.json"


@dataclass(kw_only=True)
class AttemptRecord:
    """What a runtime keeps about one attempt, in ``job.json`` in the attempt's directory: the
    fields every runtime shares (JobSync reads and writes them); each runtime adds its own."""

    job_id: str
    attempt: int
    name: str
    max_runtime_s: int | None
    started_at: float
    log_offset: int = 0  # bytes of the log file the cloud has acknowledged
    stop_reason: str | None = None  # why it ended other than by its own exit status (sent as the reason)
    never_ran: bool = False  # it ended before its command ran: the cloud bills nothing for it
    stop_cancel: bool = False
    stop_at: float | None = None
    stop_grace_s: float | None = None  # the cloud's grace for this stop; None: the agent's --stop-grace
    outcome: Outcome | None = None
    exit_code: int | None = None
    reported: bool = False  # the final state reached the cloud
    reported_state: str | None = None  # the last non-final state the cloud acknowledged
    fenced: bool = False  # the cloud called this attempt stale: stop it, report nothing more
    lost_reason: str | None = None  # why it was found gone when the agent came back
    artifacts_uploaded: list[str] = field(default_factory=list)  # refused ones too: never sent twice
    artifact_problems: list[str] = field(default_factory=list)  # why the cloud refused an artifact
    artifact_max_bytes: int | None = None  # the cloud's limit, from the assignment: bigger is not read
    # An endpoint replica's: the unix socket its engine's supervisor serves (docs/endpoints.md). The
    # attempt is reported running once the engine answers there; the tunnel's streams lead to it.
    engine_socket: str | None = None

    @property
    def key(self) -> str:
        return attempt_key(self.job_id, self.attempt)

    @property
    def serves_engine(self) -> bool:
        """An endpoint replica's attempt: reported running only once its engine serves."""
        return self.engine_socket is not None

    @property
    def command_started(self) -> bool:
        """Its command has started, so it may be reported ``running``, which billing starts from
        (docs/billing.md). A local attempt's process is started by ``start``; a Kubernetes one's
        only once its pods' main containers are (after the image pull and the inputs' fetch)."""
        return True

    def grace(self, default: float) -> float:
        """Seconds between SIGTERM and SIGKILL for this attempt's stop."""
        return default if self.stop_grace_s is None else self.stop_grace_s


J = TypeVar("J", bound=AttemptRecord)


@runtime_checkable
class KeepsWorkspaces(Protocol):
    """A runtime that keeps dev environments' workspaces on the CPod between their attempts."""

    def forget_workspace(self, workspace: str) -> bool:
        """Removes a stopped environment's workspace; False when this CPod kept none."""
        ...


class Runtime(Protocol[J]):
    """Where a CPod runs its jobs. ``jobs`` holds the attempts not yet reported final, by
    ``"<job_id>:<attempt>"``."""

    @property
    def jobs(self) -> Mapping[str, J]: ...

    @property
    def takes_fine_tunes(self) -> bool:
        """Whether it runs assignments with inputs and the trainer (the cloud sends them only then)."""
        ...

    @property
    def takes_endpoints(self) -> bool:
        """Whether it runs endpoint replicas (``Assignment.engine``; the cloud sends them only then)."""
        ...

    @property
    def takes_dev_envs(self) -> bool:
        """Whether it runs dev environments (``Assignment.jupyter``; the cloud sends them only then)."""
        ...

    def knows(self, job_id: str, attempt: int) -> bool:
        """This attempt was started here before (perhaps before a restart): never start it twice."""
        ...

    def start(self, assignment: Assignment, inputs: Mapping[str, Path] | None = None) -> J:
        """Starts the attempt once; raises RuntimeError or OSError (with a reason for the cloud) when
        it cannot. ``inputs``: where the agent's cache holds each of ``assignment.inputs``, by name
        (fetched before; a runtime that cannot take inputs refuses an assignment that has any)."""
        ...

    def stop(
        self, job_id: str, attempt: int, reason: str, cancel: bool, grace_s: float | None = None
    ) -> J | None:
        """Stops an attempt: SIGTERM, then SIGKILL ``grace_s`` later (None: the agent's --stop-grace)."""
        ...

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

    def outputs(self, job: J) -> OutputTree | None:
        """The attempt's files that the agent uploads as artifacts (its checkpoints while it runs,
        the rest when it ends), or None when the runtime has none (its pods upload their own)."""
        ...

    def used_gpu_count(self) -> int:
        """GPUs held by this runtime's attempts that have not ended."""
        ...

    def nodes_to_report(self, nodes: list[Node]) -> list[Node]:
        """The inventory's nodes as the heartbeat reports them, with what this runtime's own
        attempts hold counted where the inventory cannot see it."""
        ...

    def accept_owners(self, owner_ids: frozenset[str] | None) -> None:
        """Whose jobs the cloud says this CPod may start (None: anyone's)."""
        ...

    def engine_target(self, job: J) -> Target | None:
        """Where the engine of a replica's attempt (``serves_engine``) is reached; None: not known yet."""
        ...

    def attempt_target(self, target: str) -> Target | None:
        """The service of a running attempt a tunnel stream's target names (an engine, a dev
        environment's); None: none of this runtime's."""
        ...


class AttemptDirs(Generic[J]):
    """Each attempt's directory under ``root``, holding its record (``job.json``), and what every
    runtime does alike with the records it holds in ``jobs``."""

    jobs: dict[str, J]

    def __init__(self, root: Path) -> None:
        self.root = root

    def workdir(self, job_id: str, attempt: int) -> Path:
        return self.root / f"{job_id}-{attempt}"

    def save(self, job: J) -> None:
        directory = self.workdir(job.job_id, job.attempt)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / RECORD_FILE
        temp = path.with_suffix(".tmp")
        temp.write_text(json.dumps(asdict(job)))
        os.replace(temp, path)  # a crash leaves the old record or the new one, never half of one

    def stop(
        self, job_id: str, attempt: int, reason: str, cancel: bool, grace_s: float | None = None
    ) -> J | None:
        """Records the stop once, saved before anything is signalled (a stopping or ended attempt is
        left as it is), then begins it; the runtime's supervision finishes it (the grace, the end)."""
        job = self.jobs.get(attempt_key(job_id, attempt))
        if job is None or job.outcome is not None or job.stop_at is not None:
            return job
        job.stop_reason, job.stop_cancel, job.stop_at = reason, cancel, time.time()
        job.stop_grace_s = grace_s
        self.save(job)
        self.begin_stop(job)
        return job

    def begin_stop(self, job: J) -> None:
        """What the runtime does at once for a stop just recorded: nothing, where its supervision
        pass does all of it (Kubernetes deletes the pods in ``refresh``)."""
