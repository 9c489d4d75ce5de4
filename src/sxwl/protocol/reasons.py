"""Reasons and events as codes: why a job waits, fails or is cancelled, and what happened to a job
or a fine-tune, kept as a code and its parameters (as dstack keeps ``JobTerminationReason``), so that
each surface words it in its own language from the code: the API in English (``english``), the
console in the reader's (web/i18n/reasons.py). Nothing parses a sentence back.

Rows written before the codes hold English sentences; they read back as the code ``text`` and are
shown as they were stored. An agent's own words (a runtime's error) are ``text`` too, unless the
agent sent a code this module knows."""

from __future__ import annotations

import json
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TypeAlias

Param: TypeAlias = "str | int | float | Reason | None"
TEXT = "text"  # words stored as they are: a row from before the codes, or an agent's own
_STORED_PREFIX = '{"code":'


@dataclass(frozen=True)
class Reason:
    code: str
    params: Mapping[str, Param] = field(default_factory=dict)

    @classmethod
    def of(cls, code: str, /, **params: Param) -> Reason:
        assert code in ENGLISH, code  # a new code needs its English here and its Chinese in the console
        return cls(code, params)

    @classmethod
    def text(cls, words: str) -> Reason:
        return cls(TEXT, {"text": words})

    @cached_property
    def stored(self) -> str:
        """How a column keeps it (JSON); ``read`` turns it back."""
        return json.dumps(self.plain(), ensure_ascii=False, separators=(",", ":"))

    def plain(self) -> dict[str, object]:
        """As JSON's types: ``{"code": ..., "params": {...}}``; ``from_plain`` turns it back."""
        params = {k: v.plain() if isinstance(v, Reason) else v for k, v in self.params.items()}
        return {"code": self.code, "params": params}

    def stored_within(self, limit: int) -> str:
        """``stored`` in at most ``limit`` characters: its longest words are shortened by what is
        over, so the words keep as much as the column holds (an agent's message can be as long as
        the column)."""
        fitted = self
        for _ in range(8):  # JSON's escapes can make one cut a little short: cut again
            over = len(fitted.stored) - limit
            if over <= 0:
                return fitted.stored
            longest = fitted._longest()
            if longest <= 8:
                break
            fitted = fitted._shortened(max(longest - over - 1, 8))
        return Reason(self.code).stored

    def _shortened(self, keep: int) -> Reason:
        def short(value: Param) -> Param:
            if isinstance(value, Reason):
                return value._shortened(keep)
            if isinstance(value, str) and len(value) > keep:
                return value[: keep - 1] + "…"
            return value

        return Reason(self.code, {k: short(v) for k, v in self.params.items()})

    def _longest(self) -> int:
        return (
            max(
                (v._longest() if isinstance(v, Reason) else len(v) if isinstance(v, str) else 0)
                for v in self.params.values()
            )
            if self.params
            else 0
        )

    @classmethod
    def read(cls, stored: str | None) -> Reason | None:
        """A column's value: a coded reason, or (a row from before the codes) its words as stored."""
        if stored is None:
            return None
        if stored.startswith(_STORED_PREFIX):
            try:
                return from_plain(json.loads(stored))
            except (ValueError, TypeError, KeyError):
                pass
        return cls.text(stored)

    @classmethod
    def from_wire(
        cls,
        code: str | None,
        params: Mapping[str, str | int | float | None],
        words: str | None,
        parts: Mapping[str, str] | None = None,
    ) -> Reason | None:
        """What an agent reported: its code when this cloud knows it and has every parameter its
        English names, else its words (None: it gave no reason). ``parts``: the parameters that are
        reasons themselves (a failed rank's cause, say), each as its ``stored`` JSON; one this cloud
        cannot read whole makes the report its words."""
        if words is None:
            return None
        nested = {name: cls.read(value) for name, value in (parts or {}).items()}
        said = cls(code or TEXT, {**params, **nested})
        return said if code is not None and code != TEXT and said.known() else cls.text(words)

    def known(self) -> bool:
        """Every code in it (nested ones too) is this module's, with every parameter its English
        names: what this cloud can word in each language."""
        if self.code == TEXT:
            return isinstance(self.params.get("text"), str)
        template = ENGLISH.get(self.code)
        return (
            template is not None
            and set(fields(template)) <= set(self.params)
            and all(v.known() for v in self.params.values() if isinstance(v, Reason))
        )


def from_plain(plain: Mapping[str, object]) -> Reason:
    code = plain["code"]
    raw = plain.get("params") or {}
    if not isinstance(code, str) or not isinstance(raw, dict):
        raise TypeError("not a stored reason")
    params: dict[str, Param] = {}
    for key, value in raw.items():
        if isinstance(value, dict):
            params[key] = from_plain(value)
        elif value is None or isinstance(value, str | int | float):
            params[key] = value
        else:
            raise TypeError("not a stored reason")
    return Reason(code, params)


def fields(template: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


def render(reason: Reason, template_of: Callable[[str], str | None]) -> str:
    """``reason`` in the words ``template_of`` gives for each code (English where it gives none);
    nested reasons are rendered the same way, numbers of losses to four places."""
    if reason.code == TEXT:
        return str(reason.params.get("text", ""))
    template = template_of(reason.code) or ENGLISH.get(reason.code)
    if template is None:  # a code from a newer cloud: say what can be said
        return reason.code
    values: dict[str, str] = {}
    for name in fields(template):
        value = reason.params.get(name)
        if isinstance(value, Reason):
            values[name] = render(value, template_of)
        elif isinstance(value, float):
            values[name] = f"{value:.4f}"
        else:
            values[name] = "" if value is None else str(value)
    return template.format(**values)


def english(reason: Reason | None) -> str | None:
    return None if reason is None else render(reason, ENGLISH.get)


# The English of every code: what the API says, and the console's English.
ENGLISH: dict[str, str] = {
    # what a queued job needs, named inside other reasons
    "need.cpu": "a CPU-only node",
    "need.gpus": "{gpus} × {product}",
    "need.gpus_any": "{gpus} × GPU",
    "need.nodes": "{nodes} nodes with {each} each",
    "need.cores": "{each} with {cpus} CPU cores",
    "need.memory": "{each} with {memory_gib} GiB of memory",
    # why a queued job waits (the scheduler's words)
    "queue.scheduler": "waiting for the scheduler",
    "queue.pinned_offline": "CPod {cpod} is not online",
    "queue.no_gpus": "no online CPod has GPUs; the job needs {need}",
    "queue.never_fits": "no online CPod offers {need}",
    "queue.busy": "waiting for {need} to become free",
    "queue.busy_held": "waiting for {what} held by other work to become free (the job needs {need})",
    "held.gpus": "GPUs",
    "held.cores": "CPU cores",
    "held.memory": "memory",
    "held.and": "{first} and {then}",
    "queue.no_dev_env": "the CPods that offer {need} run no dev environments (a Kubernetes CPod runs them "
    "once its agent has a dev environment image: the chart's devEnvs)",
    "queue.no_endpoint": "the CPods that offer {need} do not run inference engines (a Kubernetes CPod's "
    "agent needs an engine image)",
    "queue.image": "the CPods that offer {need} run jobs as local processes and cannot run a container "
    "image: submit the job without image, or wait for a Kubernetes CPod",
    "queue.no_trainer": "the CPods that offer {need} do not run fine-tunes (a Kubernetes CPod needs its "
    "agent's --trainer-image): wait for one that does",
    "queue.no_trainer_restricted": "the CPods that offer {need} do not run fine-tunes (a Kubernetes CPod "
    "needs its agent's --trainer-image), or take only the jobs of their provider and of the accounts it "
    "trusts",
    "queue.restricted": "the CPods that offer {need} run jobs without isolation and take only the jobs of "
    "their provider and of the accounts it trusts",
    "queue.limit": "your limit of {limit} concurrent GPUs is reached ({used} in use)",
    "queue.top_up": "waiting for a top-up: your balance is {balance} CNY",
    "queue.no_price_cpu": "no price is set for CPU-only work yet: an administrator must set one",
    "queue.no_price_product": "no price is set for {product} yet: an administrator must set one",
    "queue.no_price_gpu": "no GPU product has a price yet: an administrator must set one",
    "queue.requeued": "queued again: {why}",
    # a job's events and how it ended
    "job.shape": "{nodes} node(s) × {gpus} GPU(s)",
    "job.placed": "CPod {cpod}, nodes {names}",
    "job.by": "by {who}",
    "dev.paused_by": "paused by {who}",
    "dev.idle": "paused after {minutes} min without activity",
    "dev.stopped_by": "stopped by {who}",
    "dev.moved": "moved from CPod {old}, which had no room for it, to CPod {new} with its saved workspace",
    "job.unpinned": "CPod {cpod}, which it waited for, has no room: it goes to CPod {new}",
    "dev.moved_gone": "moved from CPod {old}, which went offline, to CPod {new} with its saved workspace",
    "job.unpinned_gone": "CPod {cpod}, which it waited for, went offline: it goes to CPod {new}",
    "job.cancelled_by": "cancelled by {who}",
    "job.cancelled": "cancelled",
    "job.exited_while_serving": "it exited (status {status}), but a {kind} serves until it is stopped",
    "job.cancelled_while_lost": "cancelled while its CPod was lost",
    "job.exit_code": "exit code {code}",
    "job.lost_times": "lost {times} times; last: {why}",
    "job.not_resumed": "the agent could not resume it",
    "job.cpod_offline": "CPod {cpod} went offline",
    "job.cpod_revoked": "CPod {cpod} was revoked",
    "job.balance_exhausted": "balance exhausted",
    "job.stopping": "stopping: SIGTERM, then {seconds} s to save its work",
    "job.no_adapter": "the trainer ended without writing {path}; no model was registered",
    # an agent's reasons (sent as codes by agents that know them)
    "agent.command_not_found": "command not found: {program}",
    "agent.command_not_found_but": "command not found: {program} (on PATH: {found})",
    "agent.max_runtime": "max runtime of {seconds} s exceeded",
    "agent.out_of_memory": "out of memory: the job reached its memory limit of {mib} MiB",
    "agent.no_exit_status": "the job's process ended without an exit status",
    "agent.could_not_start": "could not start: {error}",
    "agent.restarted_fetching": "the agent restarted while fetching the job's inputs",
    "agent.processes_gone": "the job's processes were gone when the agent restarted",
    "agent.kube_job_gone": "its Kubernetes Job was gone when the agent restarted",
    "agent.pod_deleted": "a pod of the job was deleted before it finished",
    "agent.and": "{first}; {then}",
    # a Kubernetes CPod's reasons (agent/runtimes/kube_status.py and its neighbours)
    "kube.rank_failed": "rank {rank} failed: {what}; the other ranks were stopped",
    "kube.oom_killed": "out of memory (OOMKilled, exit code {code})",
    "kube.image_pull": "could not pull {image} ({why})",
    "kube.image_pull_said": "could not pull {image} ({why}): {detail}",
    "kube.not_started": "the container could not start ({why})",
    "kube.not_started_said": "the container could not start ({why}): {detail}",
    "kube.job_failed": "the Kubernetes Job failed ({why})",
    "kube.job_failed_said": "the Kubernetes Job failed ({why}): {detail}",
    "kube.job_deleted": "its Kubernetes Job was deleted outside the agent",
    "kube.not_created": "could not create the Kubernetes Job: {error}",
    "kube.no_secret": "could not create the upload token's Secret: {error}",
    "kube.unschedulable": "unschedulable for more than {seconds} s: {detail}",
    "kube.no_image": "the job has no container image; a Kubernetes CPod runs every job as a container",
    "kube.no_fine_tunes": "this CPod runs no fine-tunes: its agent needs --trainer-image and "
    "--uploader-image",
    "kube.no_engine": "this CPod runs no endpoints: its agent needs --engine-image and --uploader-image",
    "kube.no_dev_envs": "this CPod runs no dev environments: its agent needs --dev-env-image and "
    "--uploader-image",
    "kube.no_upload_token": "the cloud sent no upload token, which the pod needs to fetch its inputs",
    "kube.inputs": "inputs not fetched: {error}",
    "kube.fetcher_failed": "inputs not fetched: the fetcher failed ({detail})",
    "kube.uploads": "artifacts not uploaded: {error}",
    "kube.uploader_failed": "artifacts not uploaded: the uploader failed ({detail})",
    "kube.more_ranks": "{first}; and {more} more ranks",
    # a CPod's events (services/fleet/cpods.py, heartbeats.py)
    "cpod.agent": "{runtime} agent {version}",
    "cpod.again": "registered again (new agent token); {runtime} agent {version}",
    "cpod.again_revoked": "registered again after revocation; {runtime} agent {version}",
    "cpod.fine_tunes": "now takes fine-tunes",
    "cpod.no_fine_tunes": "no longer takes fine-tunes",
    "cpod.endpoints": "now runs endpoint replicas",
    "cpod.no_endpoints": "no longer runs endpoint replicas",
    "cpod.dev_envs": "now runs dev environments",
    "cpod.no_dev_envs": "no longer runs dev environments",
    "cpod.isolated": "jobs isolated",
    "cpod.not_isolated": "no isolation; trusts {emails}",
    "cpod.not_isolated_alone": "no isolation; trusts nobody else",
    "cpod.nodes": "{n} nodes reported",
    "cpod.nodes_one": "1 node reported",
    "cpod.missed": "{n} heartbeats missed",
    "cpod.missed_one": "1 heartbeat missed",
    "cpod.renamed": "{old} → {new}",
    # a dataset line's problems (services/finetune/dataset_checks.py)
    "data.messages": "`messages` must be a non-empty list of {{role, content}} objects",
    "data.message": "{where}: must be an object with `role` and `content`",
    "data.no_role": "{where}: missing `role`",
    "data.role": "{where}.role: unknown role {role} (allowed: {allowed})",
    "data.content": "{where}.content: must be a non-empty string",
    "data.no_assistant": "no assistant message: an example needs at least one answer to learn",
    "data.missing_key": "missing `{field}`",
    "data.empty_key": "`{field}` must be a non-empty string",
    "data.empty_file": "the file is empty: it holds no examples (one JSON object per line)",
    "data.too_long": "line is longer than {limit} bytes",
    "data.utf8": "not UTF-8 text",
    "data.json": "not JSON: {why}",
    "data.object": "not a JSON object (found {found}); each line must be one example",
    "data.format": "missing `messages` (chat format) or `prompt` and `completion`",
    "data.mixed": "a {kind} example in a {first} file: every line must have the format of the first",
    # a fine-tune's events
    "ft.validating_training": "Validating training file: {file}",
    "ft.validating_validation": "Validating validation file: {file}",
    "ft.files_validated": "Files validated",
    "ft.created": "Created fine-tuning job: {id}",
    "ft.queued": "Fine-tuning job queued",
    "ft.started": "Fine-tuning job started",
    "ft.started_on": "Fine-tuning job started on {device}",
    "ft.step": "Step {step}/{total}: training",
    "ft.step_loss": "Step {step}/{total}: training loss={loss}",
    "ft.step_eval": "Step {step}/{total}: training, validation loss={eval}",
    "ft.step_loss_eval": "Step {step}/{total}: training loss={loss}, validation loss={eval}",
    "ft.tokens_training": "Training file {file}: {examples} examples, {tokens} tokens ({trained} trained) "
    "with {model}'s tokenizer",
    "ft.tokens_validation": "Validation file {file}: {examples} examples, {tokens} tokens ({trained} "
    "trained) with {model}'s tokenizer",
    "ft.dropped": "{n} examples of file {file} dropped: no assistant token within max_seq_len",
    "ft.checkpoint": "Checkpoint at step {step} saved",
    "ft.resumed": "Resumed from checkpoint at step {step} (attempt {attempt})",
    "ft.done": "Training finished; saving the adapter",
    "ft.succeeded": "The job has successfully completed",
    "ft.cancelled": "The job was cancelled: {why}",
    "ft.failed": "The job failed: {why}",
    "ft.no_reason": "no reason given",
    "ft.requeued_resume": "Attempt {attempt} was lost ({why}); queued again, it resumes from the checkpoint "
    "at step {step}",
    "ft.requeued_fresh": "Attempt {attempt} was lost ({why}); queued again, it starts again",
    # endpoints (docs/endpoints.md)
    "endpoint.engine_failed": "the engine exited {exits} times and was not started again; its last "
    "lines:\n{lines}",
    "endpoint.replacing": "replaces replica job {job}, which failed: {why}",
    "endpoint.gave_up": "replica {replica} failed again after {times} replacements within an hour; the "
    "endpoint stopped: {why}",
}
