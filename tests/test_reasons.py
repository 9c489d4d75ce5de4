"""Reasons and events as codes (protocol/reasons.py): the scheduler names the real blocker (capacity
before price), the API says it in English and the console in the reader's language from the code, a
row written before the codes keeps its words, and an agent's "command not found" names what is on
PATH instead, in both languages."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, text

from sxwl.agent.runtimes.sandbox import EXEC_SHIM
from sxwl.agent.status_report import could_not_start, status
from sxwl.cloud.db.models import Job
from sxwl.cloud.web.i18n.reasons import ZH, reason_text
from sxwl.cloud.web.jobs import view as jobs_view
from sxwl.protocol.reasons import ENGLISH, Reason, english, fields
from tests.support.billing_api import BILLING, PRODUCT, Money
from tests.support.clock import TestClock
from tests.test_console_forms import csrf


def kept(money: Money, job_id: str) -> Reason | None:
    with money.ctx.db.session() as session:
        return session.scalar(select(Job.reason).where(Job.id == job_id))


def test_a_queued_job_names_capacity_before_price(
    clock: TestClock, make_client: Callable[..., TestClient]
) -> None:
    # A CPod without GPUs, and no GPU product priced yet.
    money = Money(make_client(**BILLING), clock, gpus=0, price=None)
    money.top_up("20")
    small = money.submit(gpu_product=None, gpus_per_node=1)
    money.nothing_assigned()
    assert money.job(small["id"])["reason"] == "no online CPod has GPUs; the job needs 1 × GPU"
    assert jobs_view.reason("zh", kept(money, small["id"])) == "没有在线的 CPod 提供 GPU；此任务需要 1 × GPU"
    # The CPod now has 8 GPUs: the small job waits for a price, one of 256 × 64 GPUs never fits.
    money.gpus = 8
    money.beat()
    huge = money.submit(gpu_product=None, gpus_per_node=64, nodes=256)
    money.nothing_assigned()
    assert money.job(small["id"])["reason"] == "no GPU product has a price yet: an administrator must set one"
    assert jobs_view.reason("zh", kept(money, small["id"])) == "还没有任何 GPU 型号定价：需要管理员设置价格"
    assert money.job(huge["id"])["reason"] == "no online CPod offers 256 nodes with 64 × GPU each"
    assert (
        jobs_view.reason("zh", kept(money, huge["id"])) == "没有在线的 CPod 能提供 256 个节点、每个 64 × GPU"
    )
    # Priced, the small one runs; the huge one still says it cannot fit.
    money.price("7.20", "10", product=PRODUCT)
    assert money.take(small["id"]) == 1
    assert money.job(huge["id"])["reason"] == "no online CPod offers 256 nodes with 64 × GPU each"


def signed_in(client: TestClient, email: str, lang: str) -> TestClient:
    browser = TestClient(client.app)
    token = csrf(browser, "/login")
    response = browser.post(
        "/login",
        data={"csrf_token": token, "email": email, "password": "correct horse"},
        follow_redirects=False,
    )
    assert response.status_code == 303, response.text
    browser.cookies.set("sxwl_lang", lang)
    return browser


def test_reasons_read_in_each_language_and_an_old_sentence_as_stored(
    clock: TestClock, make_client: Callable[..., TestClient]
) -> None:
    money = Money(make_client(**BILLING), clock)
    money.top_up("100")
    job = money.submit()
    attempt = money.take(job["id"])
    money.finish(job["id"], attempt, "failed", exit_code=3)
    assert money.job(job["id"])["reason"] == "exit code 3"
    events = money.client.get(f"/api/v1/jobs/{job['id']}/events", headers=money.user).json()
    assert (events[0]["kind"], events[0]["detail"]) == ("submitted", "1 node(s) × 2 GPU(s)")
    assert events[-1]["detail"] == "exit code 3"
    zh = signed_in(money.client, "dev@example.com", "zh").get(f"/jobs/{job['id']}").text
    en = signed_in(money.client, "dev@example.com", "en").get(f"/jobs/{job['id']}").text
    assert "退出码 3" in zh and "exit code 3" not in zh
    assert "exit code 3" in en
    # A row from before the codes holds an English sentence: every surface shows it as stored.
    with money.ctx.db.session() as session:
        session.execute(
            text("UPDATE jobs SET reason = :words WHERE id = :id"),
            {"words": "the trainer ran out of patience", "id": job["id"]},
        )
    assert money.job(job["id"])["reason"] == "the trainer ran out of patience"
    for lang in ("zh", "en"):
        page = signed_in(money.client, "dev@example.com", lang).get(f"/jobs/{job['id']}").text
        assert "the trainer ran out of patience" in page


def test_cancelling_a_finished_job_says_so_in_words(
    clock: TestClock, make_client: Callable[..., TestClient]
) -> None:
    money = Money(make_client(**BILLING), clock)
    money.top_up("100")
    job = money.submit()
    money.finish(job["id"], money.take(job["id"]))
    refused = money.client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=money.user)
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["message"] == "This job has already finished (succeeded); there is nothing to cancel."
    assert error["code"] == "job_finished" and error["details"] == {"state": "succeeded"}


def test_every_code_has_both_languages_with_the_same_parameters() -> None:
    assert set(ZH) == set(ENGLISH)
    for code, words in ENGLISH.items():
        assert set(fields(ZH[code])) == set(fields(words)), code
        # Each renders in both, and the Chinese is not the English left as it was (a code whose words
        # are only its parameters and names, "{old} → {new}" or "{gpus} × GPU", may read the same).
        said = Reason(code, dict.fromkeys(fields(words), "x"))
        assert reason_text("en", said) == english(said)
        if re.search(r"[a-z]{3,}", re.sub(r"\{[^}]*\}", "", words)):
            assert reason_text("zh", said) != english(said), code


def test_a_stored_reason_reads_back_and_fits_its_column() -> None:
    said = Reason.of("queue.requeued", why=Reason.of("job.cpod_offline", cpod="c1"))
    assert Reason.read(said.stored) == said
    assert Reason.read("queued again: CPod c1 went offline") == Reason.text(
        "queued again: CPod c1 went offline"
    )
    long = Reason.of("ft.failed", why=Reason.text("x" * 2000))
    fitted = long.stored_within(500)
    assert len(fitted) <= 500
    back = Reason.read(fitted)
    assert back is not None and back.code == "ft.failed"
    assert str(english(back)).startswith("The job failed: xxx") and str(english(back)).endswith("x…")


def test_command_not_found_names_the_interpreters_on_path(tmp_path: Path) -> None:
    # The exec shim as the sandbox runs it, on a PATH that has python3 (and python3.11) but no python.
    for name in ("python3", "python3.11", "pythonista"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    read, write = os.pipe()
    shim = [sys.executable, "-I", "-c", EXEC_SHIM, str(write), "-1", "0", "-1", "python", "train.py"]
    ran = subprocess.run(shim, pass_fds=(write,), capture_output=True, text=True, env={"PATH": str(tmp_path)})
    os.close(write)
    said = os.read(read, 4096).decode()
    os.close(read)
    assert ran.returncode == 127
    assert ran.stdout == "command not found: python (on PATH: python3, python3.11)\n"
    # The agent reports the code with its English; the cloud keeps the code and words it per reader.
    report = status(1, "failed", 127, said)
    assert report.reason == "command not found: python (on PATH: python3, python3.11)"
    assert report.reason_code == "agent.command_not_found_but"
    reason = report.said()
    assert english(reason) == report.reason
    assert jobs_view.reason("zh", reason) == "找不到命令：python（PATH 中有：python3, python3.11）"
    # A code this cloud does not know (a newer agent's) is kept as the agent's words.
    newer = Reason.from_wire("agent.something_new", {}, "something new happened")
    assert newer == Reason.text("something new happened")


@pytest.mark.parametrize(
    ("stored", "code", "english_words", "chinese"),
    [
        (
            Reason.of("agent.out_of_memory", mib=256).stored,
            "agent.out_of_memory",
            "out of memory: the job reached its memory limit of 256 MiB",
            "内存不足：任务达到了 256 MiB 的内存上限",
        ),
        (
            could_not_start(RuntimeError("no such image")),
            "agent.could_not_start",
            "could not start: no such image",
            "无法启动：no such image",
        ),
        (
            Reason.of("agent.processes_gone").stored,
            "agent.processes_gone",
            "the job's processes were gone when the agent restarted",
            "代理重启时任务的进程已不在",
        ),
    ],
)
def test_the_agents_own_reasons_travel_as_codes(
    stored: str, code: str, english_words: str, chinese: str
) -> None:
    """What the agent says of an attempt (out of memory, could not start, lost in a restart) keeps
    its English for an older cloud and its code for the console's Chinese."""
    report = status(1, "failed", None, stored)
    assert (report.reason, report.reason_code) == (english_words, code)
    assert jobs_view.reason("zh", report.said()) == chinese


def test_a_reason_inside_another_travels_whole_or_as_its_words() -> None:
    """A failed rank's cause is a reason inside the rank's: the agent sends it in ``reason_parts``;
    the cloud keeps the whole as codes only when it can word every part of it."""
    cause = Reason.of("kube.oom_killed", code=137)
    said = Reason.of("kube.rank_failed", rank=1, what=cause)
    report = status(1, "failed", 137, said.stored)
    assert (report.reason_code, report.reason_params) == ("kube.rank_failed", {"rank": 1})
    assert report.reason_parts == {"what": cause.stored}
    assert report.said() == said
    assert (
        jobs_view.reason("zh", report.said())
        == "第 1 号节点（rank）失败：内存不足（OOMKilled，退出码 137）；其余节点已停止"
    )
    words = "rank 1 failed: out of memory (OOMKilled, exit code 137); the other ranks were stopped"
    assert report.reason == words
    for part in ('{"code":"kube.newer","params":{}}', '{"code":"kube.oom_killed","params":{}}'):
        # A code this cloud does not know, or one without the parameter its words name.
        assert report.model_copy(update={"reason_parts": {"what": part}}).said() == Reason.text(words)
