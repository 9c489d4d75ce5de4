"""A cloud whose log goes to a file (JSON lines) with a real agent running a job: the agent's
routine requests (heartbeats, long-polls, status, logs) are not in it at INFO, one line each, while
people's requests and the agent's errors are."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from sxwl.protocol import paths
from tests.test_jobs_process import World


def test_an_agents_routine_requests_stay_out_of_an_info_log(tmp_path: Path, db_url: str) -> None:
    world = World(tmp_path, db_url)
    try:
        world.agent()
        world.online()
        job_id = world.submit("echo hello; sleep 1; echo done")
        assert world.wait_state(job_id, "succeeded", "failed", timeout=60)["state"] == "succeeded"
        assert "done" in world.logs(job_id)
        # An agent's error is still worth a line: a heartbeat with a token that is no CPod's.
        wrong = httpx.post(
            world.url + paths.url(paths.HEARTBEAT),
            headers={"Authorization": "Bearer not-a-cpod-token"},
            json={"seq": 1, "nodes": [], "jobs": []},
        )
        assert wrong.status_code == 401
    finally:
        world.close()
    requests = [
        entry
        for entry in (json.loads(line) for line in world.cloud.log_path.read_text().splitlines())
        if entry.get("msg") == "request"
    ]
    agent = [e for e in requests if e["path"].startswith("/api/v1/agent/")]
    assert [(e["path"], e["status"], e["level"]) for e in agent] == [
        (paths.url(paths.HEARTBEAT), 401, "info")
    ]
    mine = [(e["method"], e["path"], e["status"]) for e in requests]
    assert ("POST", "/api/v1/jobs", 201) in mine and ("GET", f"/api/v1/jobs/{job_id}", 200) in mine
