"""Jobs through the whole system on the real test nodes (tests/support/k8s_node.py): submitted to a
real cloud, run by `sxwl-agent --runtime kubernetes` as Kubernetes Jobs in real containers, their
logs streamed back by rank, their outputs uploaded from the pods as artifacts, and every way a job
can go wrong ending with a reason a user understands and nothing left running."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime

import httpx
import pytest

from sxwl.agent.runtimes.kube_objects import CONTAINER
from tests.support.agent import eventually
from tests.support.k8s import K8sCluster
from tests.support.k8s_node import RealNodes
from tests.support.real_cpod import RealCPod

pytestmark = pytest.mark.k8s

ARTIFACT_LIMIT = 4 * 1024 * 1024
MEMORY_LIMIT = "192Mi"


@pytest.fixture(scope="module")
def cpod(
    k8s_cluster: K8sCluster, real_nodes: RealNodes, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealCPod]:
    real = RealCPod(
        k8s_cluster,
        real_nodes,
        tmp_path_factory.mktemp("real-cpod"),
        "--pod-memory-limit",
        MEMORY_LIMIT,
        cloud_env={"SXWL_ARTIFACT_MAX_BYTES": str(ARTIFACT_LIMIT)},
    )
    yield real
    real.stop()


def steps_of(log: str, rank: int = 0) -> list[int]:
    return [int(n) for n in re.findall(rf"^\[rank {rank}\] step (\d+) loss", log, re.MULTILINE)]


def test_tiny_lm_runs_in_a_real_container_streams_its_log_and_hands_back_its_checkpoint(
    cpod: RealCPod,
) -> None:
    job_id = cpod.tiny_lm(60)
    # The log is live: steps arrive while the job still runs.
    running = cpod.wait(job_id, lambda j: j["state"] in ("running", "succeeded"), 120, "to run")
    job = cpod.finished(job_id)
    assert job["state"] == "succeeded", (job, cpod.log(job_id), cpod.agent_log[-3000:])
    assert running["started_at"] is not None
    log = cpod.log(job_id)
    # Every step once, in order: no gap, no duplicate, each line prefixed by its rank.
    assert steps_of(log) == list(range(1, 61)), log
    assert all(line.startswith("[rank 0] ") for line in log.splitlines() if line), log

    artifacts = cpod.artifacts(job_id)
    checkpoint = next(path for path in artifacts if path.startswith("checkpoint"))
    assert {checkpoint, "metrics.json"} <= set(artifacts)
    metrics = json.loads(cpod.download(job_id, "metrics.json"))
    assert metrics["steps"] == 60 and metrics["interrupted"] is False
    assert len(cpod.download(job_id, checkpoint)) == artifacts[checkpoint]["size"] > 0
    cpod.nothing_left(job_id)


def test_a_tenant_job_has_no_cluster_access_and_no_upload_credential(cpod: RealCPod) -> None:
    probe = (
        "import os, socket\n"
        "print('sa-token', os.path.exists('/var/run/secrets/kubernetes.io/serviceaccount/token'))\n"
        "print('upload-secret', os.path.exists('/sxwl-upload'))\n"
        "print('env-token', any(v.startswith('sxup_') for v in os.environ.values()))\n"
        "print('uid', os.getuid())\n"
        "print('output', os.environ['SXWL_OUTPUT_DIR'])\n"
        "try:\n"
        "    socket.create_connection(('kubernetes.default.svc', 443), timeout=3)\n"
        "    print('api reachable')\n"
        "except OSError:\n"
        "    print('api unreachable')\n"
    )
    job_id = cpod.submit(["python3", "-c", probe], name="probe")
    job = cpod.finished(job_id)
    log = cpod.log(job_id)
    assert job["state"] == "succeeded", (job, log)
    assert "[rank 0] sa-token False" in log
    assert "[rank 0] upload-secret False" in log
    assert "[rank 0] env-token False" in log
    assert "[rank 0] output /sxwl/output" in log
    assert "[rank 0] api unreachable" in log
    # The tenant's namespace keeps its NetworkPolicy and quota (invariant 7).
    kinds = cpod.cluster.kubectl("get", "networkpolicy,resourcequota", "-n", cpod.tenant_ns, "-o", "name")
    assert "networkpolicy" in kinds and "resourcequota" in kinds


def test_each_way_a_job_fails_ends_with_a_reason_and_leaves_nothing_running(cpod: RealCPod) -> None:
    big = ARTIFACT_LIMIT + 1024
    jobs = {
        "exit": cpod.submit(
            'echo about to fail; echo partial > "$SXWL_OUTPUT_DIR/partial.txt"; exit 3', name="exit-3"
        ),
        "not-found": cpod.submit(["no-such-program", "--train"], name="not-found"),
        "sh-not-found": cpod.submit("python -V", name="sh-not-found"),  # the image has only python3
        "image": cpod.submit(["python3", "-V"], image="sxwl.test/no-such-image:1", name="no-image"),
        "oom": cpod.submit(["python3", "-c", "b = bytearray(1024 ** 3); print(len(b))"], name="oom"),
        "too-large": cpod.submit(
            [
                "python3",
                "-c",
                f"import os; open(os.environ['SXWL_OUTPUT_DIR'] + '/model.bin', 'wb').write(b'x' * {big})",
            ],
            name="too-large",
        ),
    }
    ended = {kind: cpod.finished(job_id, timeout=240) for kind, job_id in jobs.items()}
    reasons = {kind: str(job["reason"]) for kind, job in ended.items()}
    assert {kind: job["state"] for kind, job in ended.items()} == dict.fromkeys(jobs, "failed"), ended
    assert ended["exit"]["exit_code"] == 3 and "exit code 3" in reasons["exit"]
    assert "about to fail" in cpod.log(jobs["exit"])
    # A failed job's outputs still come back (what it saved before failing is the user's to keep).
    assert cpod.download(jobs["exit"], "partial.txt") == b"partial\n"
    # The shell's "not found" is the whole log (the termination message's tail, FallbackToLogsOnError):
    # a start that never ran, said as such.
    assert reasons["not-found"] == "command not found: no-such-program", reasons
    assert reasons["sh-not-found"].startswith("command not found: python (on PATH: python3"), reasons
    assert "sxwl.test/no-such-image:1" in reasons["image"], reasons
    assert "OOMKilled" in reasons["oom"], reasons
    assert "model.bin" in reasons["too-large"] and str(ARTIFACT_LIMIT) in reasons["too-large"], reasons
    assert ended["too-large"]["state"] == "failed"
    for job_id in jobs.values():
        cpod.nothing_left(job_id)
    # What a user reads in `sxwl jobs show`: the same reason.
    shown = sxwl_jobs_show(cpod, jobs["oom"])
    assert "OOMKilled" in shown, shown


def sxwl_jobs_show(cpod: RealCPod, job_id: str) -> str:
    """`sxwl jobs show` as the user runs it, signed in (its credentials file) as the job's owner."""
    config = cpod.root / "sxwl-config"
    config.mkdir(mode=0o700, exist_ok=True)
    token = cpod.user["Authorization"].removeprefix("Bearer ")
    (config / "credentials.json").write_text(json.dumps({"url": cpod.url, "token": token, "email": "user"}))
    result = subprocess.run(
        [sys.executable, "-m", "sxwl.cli", "jobs", "show", job_id],
        env={"PATH": "/usr/bin:/bin", "SXWL_CONFIG_DIR": str(config), "COLUMNS": "200", "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_cancel_stops_the_script_with_sigterm_and_deletes_the_pods(cpod: RealCPod) -> None:
    job_id = cpod.tiny_lm(1_000_000)
    eventually(lambda: steps_of(cpod.log(job_id)), timeout=120, what="the first steps in the log")
    # Billing starts at `running`, reported once the main container had started (docs/billing.md).
    running = cpod.wait(job_id, lambda j: j["started_at"] is not None, 30, "to run")
    (pod,) = cpod.pods(job_id)
    main = next(s for s in pod["status"]["containerStatuses"] if s["name"] == CONTAINER)
    assert datetime.fromisoformat(running["started_at"]) >= datetime.fromisoformat(
        main["state"]["running"]["startedAt"]
    ), (running, main)
    response = httpx.post(f"{cpod.url}/api/v1/jobs/{job_id}/cancel", headers=cpod.user)
    assert response.status_code in (200, 202), response.text
    job = cpod.finished(job_id)
    assert job["state"] == "cancelled", job
    eventually(lambda: "SIGTERM received" in cpod.log(job_id), timeout=30, what="the script's SIGTERM line")
    cpod.nothing_left(job_id)


# Long enough that a slow machine cannot have the kubelet kill a script held in its TERM trap before
# the test lets it go; the test waits for each step, never for this.
HELD_GRACE_S = 300


@contextlib.contextmanager
def agent_with(cpod: RealCPod, *flags: str) -> Iterator[None]:
    """The CPod's agent restarted with ``flags`` added (a flag given again wins), and restarted as it
    was afterwards. A restarted agent takes back its saved token and whatever runs; what a test
    submits next waits for it like any job for its CPod."""
    original = list(cpod.agent_flags)

    def restart(flags: list[str]) -> None:
        assert cpod.agent is not None
        cpod.agent.stop()
        cpod.agent_flags = flags
        cpod.start_agent()

    restart([*original, *flags])
    try:
        yield
    finally:
        restart(original)


def test_what_a_cancelled_script_prints_last_reaches_the_log_though_its_pod_is_gone(
    cpod: RealCPod,
) -> None:
    """The agent is stopped (SIGSTOP) once it has deleted the pod, and only then is the script, held
    in its TERM trap, let go to print its last line and exit; the agent stays stopped until the pod,
    its containers and their logs are gone from the cluster. The line still arrives, through the log
    stream the agent opened before the delete.

    Every step waits for the one before it, never for time: the script prints nothing on TERM until
    the test writes /tmp/go in its container (so the agent cannot have sent the line before it was
    stopped, however slowly the test saw the deletion), and the pods' grace (HELD_GRACE_S) is far
    longer than those steps take on a loaded machine. (It once printed at once on TERM, and the test
    assumed that it stopped the agent before the agent's next shipment of the log, 0.5 s later.)"""
    script = (
        "trap 'until [ -e /tmp/go ]; do sleep 0.1; done; echo goodbye on TERM; exit 0' TERM; "
        "echo started; while :; do sleep 0.2; done"
    )
    with agent_with(cpod, "--stop-grace", str(HELD_GRACE_S)):
        job_id = cpod.submit(script, name="last-words")
        eventually(lambda: "started" in cpod.log(job_id), timeout=120, what="the job's first line")
        response = httpx.post(f"{cpod.url}/api/v1/jobs/{job_id}/cancel", headers=cpod.user)
        assert response.status_code in (200, 202), response.text
        # The pod stays, terminating, while its script waits in the trap.
        (pod,) = eventually(
            lambda: [p for p in cpod.pods(job_id) if p["metadata"].get("deletionTimestamp")],
            timeout=120,
            what="the agent deleting the pod",
        )
        assert cpod.agent is not None
        cpod.agent.signal(signal.SIGSTOP)
        try:
            name = pod["metadata"]["name"]
            go = ("exec", "-n", cpod.tenant_ns, name, "-c", CONTAINER, "--", "sh", "-c", ": > /tmp/go")
            cpod.cluster.kubectl(*go)
            eventually(lambda: not cpod.pods(job_id), timeout=120, what="the pod to be gone")
            assert "goodbye" not in cpod.log(job_id)  # printed while the agent was stopped
        finally:
            cpod.agent.signal(signal.SIGCONT)
        job = cpod.finished(job_id)
        assert job["state"] == "cancelled", job
        assert cpod.log(job_id).splitlines() == ["[rank 0] started", "[rank 0] goodbye on TERM"]


def test_a_pod_deleted_under_a_job_fails_it_with_that_reason(cpod: RealCPod) -> None:
    job_id = cpod.submit("echo started; sleep 600", name="victim")
    eventually(lambda: "started" in cpod.log(job_id), timeout=120, what="the job's first line")
    (pod,) = cpod.pods(job_id)
    cpod.cluster.kubectl("delete", "pod", "-n", cpod.tenant_ns, pod["metadata"]["name"], "--wait=false")
    job = cpod.finished(job_id)
    assert job["state"] == "failed" and "deleted" in str(job["reason"]), job
    cpod.nothing_left(job_id)


RENDEZVOUS = r"""
import os, socket, time
rank, port, master = int(os.environ["NODE_RANK"]), int(os.environ["MASTER_PORT"]), os.environ["MASTER_ADDR"]
value = rank + 1
if rank == 0:
    server = socket.create_server(("", port))
    conn, _ = server.accept()
    other = int(conn.recv(64))
    conn.sendall(str(value).encode())
else:
    for _ in range(120):
        try:
            conn = socket.create_connection((master, port), timeout=2)
            break
        except OSError:
            time.sleep(0.5)
    conn.sendall(str(value).encode())
    other = int(conn.recv(64))
print("all-reduce sum", value + other, "via", master, flush=True)
with open(os.environ["SXWL_OUTPUT_DIR"] + "/rank.txt", "w") as out:
    out.write(f"{rank} {socket.gethostname()}\n")
time.sleep(3)  # both pods stay long enough for the test to see where they ran
"""


def test_a_two_node_job_rendezvouses_across_nodes_through_the_headless_service(
    cpod: RealCPod, real_nodes: RealNodes
) -> None:
    job_id = cpod.submit(["python3", "-c", RENDEZVOUS], name="allreduce", nodes=2)
    hosts: set[str] = set()

    def both_placed() -> bool:
        hosts.update(p["spec"].get("nodeName", "") for p in cpod.pods(job_id))
        hosts.discard("")
        return len(hosts) == 2

    eventually(both_placed, timeout=120, what="both ranks on nodes")
    job = cpod.finished(job_id)
    log = cpod.log(job_id)
    assert job["state"] == "succeeded", (job, log)
    assert hosts == set(real_nodes.names), hosts  # one rank per real node
    for rank in (0, 1):
        assert re.search(rf"^\[rank {rank}\] all-reduce sum 3 via \S+-0\.\S+$", log, re.MULTILINE), log
    artifacts = cpod.artifacts(job_id)
    assert {"rank-0/rank.txt", "rank-1/rank.txt"} <= set(artifacts), artifacts
    assert cpod.download(job_id, "rank-1/rank.txt").startswith(b"1 ")


def test_a_rank_that_exits_early_fails_the_job_and_stops_the_others(cpod: RealCPod) -> None:
    command = 'if [ "$NODE_RANK" = 1 ]; then echo giving up; exit 5; fi; echo waiting; sleep 600'
    job_id = cpod.submit(command, name="early", nodes=2)
    job = cpod.finished(job_id, timeout=240)
    assert job["state"] == "failed" and "rank 1" in str(job["reason"]), job
    assert job["exit_code"] == 5
    cpod.nothing_left(job_id)


def test_artifacts_reach_the_cloud_while_the_agent_is_down_and_the_restarted_agent_ends_the_job(
    cpod: RealCPod,
) -> None:
    size = 3 * 1024 * 1024
    script = (
        "import os, time\n"
        "print('writing', flush=True)\n"
        "time.sleep(2)\n"
        f"open(os.environ['SXWL_OUTPUT_DIR'] + '/weights.bin', 'wb').write(os.urandom({size}))\n"
    )
    job_id = cpod.submit(["python3", "-c", script], name="restart")
    eventually(lambda: "writing" in cpod.log(job_id), timeout=120, what="the job to start writing")
    assert cpod.agent is not None
    cpod.agent.signal(signal.SIGKILL)
    cpod.agent.wait()
    # No agent: the pod's uploader alone sends the file, with the attempt's own credential.
    eventually(lambda: "weights.bin" in cpod.artifacts(job_id), timeout=120, what="the upload")
    assert cpod.job(job_id)["state"] == "running"
    cpod.start_agent()
    job = cpod.finished(job_id)
    assert job["state"] == "succeeded", (job, cpod.agent_log[-3000:])
    assert cpod.artifacts(job_id)["weights.bin"]["size"] == size
    assert len(cpod.download(job_id, "weights.bin")) == size
