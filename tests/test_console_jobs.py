"""任务 (jobs) in the console over HTTP: the submit form (validated by the API's own JobIn, errors in
place), the list with its tabs, search and pages, a job's page, cancel, and who may see what."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sxwl.cloud.web.i18n import MESSAGES
from sxwl.cloud.web.jobs import view as jobs_view
from sxwl.protocol.reasons import Reason, english
from tests.conftest import login, register
from tests.support.agent import eventually
from tests.support.cpods import A100, access_key, beat, gpu_node, register_cpod
from tests.test_admin_api import make_admin
from tests.test_console_forms import csrf, register_form

PRODUCT = str(A100["product"])
VALID = {
    "name": "tiny-lm",
    "command": "python3 train.py --epochs 3",
    "image": "",
    "env": "LR=0.1\n\n# a comment\nEPOCHS = 3\n",
    "gpu_product": "",
    "gpus_per_node": "1",
    "nodes": "1",
    "max_runtime_min": "",
    "cpod_id": "",
}


def browser_user(client: TestClient, email: str = "dev@example.com", role: str = "user") -> TestClient:
    """A new browser-like client (own cookies) signed up through the form."""
    browser = TestClient(client.app)
    register_form(browser, role, email)
    return browser


def submit_form(browser: TestClient, **fields: str) -> Any:
    token = csrf(browser, "/jobs/new")
    return browser.post("/jobs/new", data={"csrf_token": token, **(VALID | fields)}, follow_redirects=False)


def submitted_id(response: Any) -> str:
    assert response.status_code == 303, response.text
    match = re.fullmatch(r"/jobs/([0-9a-z]+)\?notice=job_submitted", response.headers["location"])
    assert match, response.headers["location"]
    return match.group(1)


def api_jobs(browser: TestClient, **params: Any) -> dict[str, Any]:
    response = browser.get("/api/v1/jobs", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def online_cpod(client: TestClient, gpus: int = 8) -> dict[str, str]:
    """A provider's CPod with ``gpus`` A100s, online; the agent's headers."""
    register(client, "farm@example.com", "provider")
    key = access_key(client, login(client, "farm@example.com"))
    reg = register_cpod(client, key)
    assert beat(client, reg["cpod_token"], 1, [gpu_node("w1", count=gpus)]).status_code == 200
    return {"Authorization": f"Bearer {reg['cpod_token']}"}


def field_error(page: str, field: str) -> str:
    match = re.search(rf'<p class="field-error" id="e-{field}"[^>]*>([^<]*)</p>', page)
    assert match, f"no error shown for {field}"
    return match.group(1)


def rows(page: str) -> list[str]:
    """The job ids of the list's rows, in order."""
    return re.findall(r'<tr data-key="([0-9a-z]+)"', page)


# ---- the form -------------------------------------------------------------------------------


def test_form_offers_the_online_gpu_products(client: TestClient) -> None:
    online_cpod(client, gpus=8)
    browser = browser_user(client)
    page = browser.get("/jobs/new")
    assert page.status_code == 200
    assert f'<option value="{PRODUCT}"' in page.text
    assert f"{PRODUCT} · 80 GiB（可用 8 / 共 8）" in page.text
    assert '<option value="">任意型号</option>' in page.text
    # The sandbox has python3, not always python: the copyable line and the placeholder say so.
    assert "sxwl jobs submit --gpus 1 -- python3 train.py" in page.text
    assert 'placeholder="python3 train.py --epochs 3"' in page.text
    assert "python train.py" not in page.text
    assert "仅 Kubernetes CPod 使用" in page.text  # the image field says who uses it
    # How code reaches a CPod: no upload; an image on Kubernetes; what is on the machine locally.
    note = page.text[page.text.index('id="code-note"') :]
    assert "没有代码上传" in note and "本机（local）CPod 不使用镜像" in note
    assert "最长运行时间（分钟）" in page.text
    # An online CPod has GPUs: the form starts at one.
    assert re.search(r'id="f-gpus_per_node" name="gpus_per_node" value="1"', page.text)


def test_form_starts_at_0_gpus_where_no_online_cpod_has_any(client: TestClient) -> None:
    """Submitted untouched, the form asks for what can run: a GPU asked for on a fleet without one
    would keep the job queued for ever (issue 26, point 4)."""
    online_cpod(client, gpus=0)
    browser = browser_user(client)
    page = browser.get("/jobs/new").text
    assert re.search(r'id="f-gpus_per_node" name="gpus_per_node" value="0"', page)
    browser.cookies.set("sxwl_lang", "en")
    english = browser.get("/jobs/new").text
    assert "There is no code upload" in english and "A local CPod uses no image" in english


def test_form_errors_are_shown_in_place_and_values_kept(client: TestClient) -> None:
    browser = browser_user(client)
    response = submit_form(
        browser,
        name="keep-me",
        command="   ",
        gpus_per_node="-1",
        nodes="0",
        env="GOOD=1\nthis line has no equals\n",
        max_runtime_min="abc",
        image="my/image:1",
    )
    assert response.status_code == 422
    page = response.text
    assert field_error(page, "command") == "请输入要运行的命令。"
    assert field_error(page, "gpus_per_node") == "请输入 0 到 64 之间的整数。"
    assert field_error(page, "nodes") == "请输入 1 到 256 之间的整数。"
    assert field_error(page, "env") == "第 2 行：应为 KEY=VALUE 格式"
    assert field_error(page, "max_runtime_min").startswith("请输入 1 到 43200 之间的整数（分钟）")
    assert 'id="f-command"' in page and 'aria-invalid="true" aria-describedby="e-command"' in page
    # What was typed stays.
    assert 'value="keep-me"' in page and 'value="my/image:1"' in page and 'value="-1"' in page
    assert "GOOD=1\nthis line has no equals\n</textarea>" in page
    assert api_jobs(browser)["total"] == 0  # nothing was submitted


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ("A=1\nSXWL_JOB_ID=x", "第 2 行：SXWL_JOB_ID 由平台设置，不能自定义"),
        (
            "# vars\n\n1BAD=x",
            "第 3 行：“1BAD”不是有效的变量名（只能包含字母、数字和下划线，且不能以数字开头）",
        ),
        ("A=1\nA=2", "第 2 行：A 已在第 1 行设置"),
        ("=value", "第 1 行：缺少变量名"),
        ("CUDA_VISIBLE_DEVICES=0", "第 1 行：CUDA_VISIBLE_DEVICES 由平台设置，不能自定义"),
    ],
)
def test_env_errors_name_the_line(client: TestClient, env: str, message: str) -> None:
    browser = browser_user(client)
    response = submit_form(browser, env=env)
    assert response.status_code == 422
    assert field_error(response.text, "env") == message


def test_form_errors_in_english(client: TestClient) -> None:
    browser = browser_user(client)
    browser.get("/lang/en")
    response = submit_form(browser, command="", gpus_per_node="65", env="x y")
    assert response.status_code == 422
    assert field_error(response.text, "command") == "Enter the command to run."
    assert field_error(response.text, "gpus_per_node") == "Enter a whole number from 0 to 64."
    assert field_error(response.text, "env") == "Line 1: expected KEY=VALUE"


def test_unknown_cpod_pin_is_refused_in_place(client: TestClient) -> None:
    browser = browser_user(client)
    response = submit_form(browser, cpod_id="nosuchcpod")
    assert response.status_code == 422
    assert field_error(response.text, "cpod_id") == "没有这个 CPod。"
    assert '<details class="advanced" id="advanced" open>' in response.text  # opened to show it


def test_form_post_without_csrf_is_refused(client: TestClient) -> None:
    browser = browser_user(client)
    browser.get("/jobs/new")
    response = browser.post("/jobs/new", data={"csrf_token": "forged", **VALID}, follow_redirects=False)
    assert response.status_code == 403
    assert "页面已过期，请刷新后重试。" in response.text
    assert 'value="tiny-lm"' in response.text
    assert api_jobs(browser)["total"] == 0


def test_submit_creates_the_job_and_shows_its_page(client: TestClient) -> None:
    browser = browser_user(client)
    response = submit_form(
        browser,
        name="tiny-lm",
        command="for i in 1 2 3; do echo step $i; done",
        gpu_product=PRODUCT,
        gpus_per_node="2",
        nodes="1",
        max_runtime_min="10",
        image="pytorch/pytorch:2.3",
    )
    job_id = submitted_id(response)
    job = browser.get(f"/api/v1/jobs/{job_id}").json()
    assert job["name"] == "tiny-lm"
    assert job["command"] == "for i in 1 2 3; do echo step $i; done"  # one shell string
    assert job["env"] == {"LR": "0.1", "EPOCHS": "3"}
    assert job["gpu_product"] == PRODUCT and job["gpus_per_node"] == 2 and job["nodes"] == 1
    assert job["max_runtime_s"] == 600 and job["image"] == "pytorch/pytorch:2.3"
    assert job["owner_email"] == "dev@example.com"

    page = browser.get(f"/jobs/{job_id}?notice=job_submitted")
    assert page.status_code == 200
    assert "任务已提交。" in page.text
    assert 'data-state="queued"' in page.text and ">排队中<" in page.text
    assert "排队第 1 位" in page.text
    assert f"没有在线的 CPod 能提供 2 × {PRODUCT}" in eventually(
        lambda: (text := browser.get(f"/jobs/{job_id}/fragment").text) and "没有在线的 CPod" in text and text,
        what="the scheduler's reason",
    )
    assert "for i in 1 2 3; do echo step $i; done" in page.text
    assert "<code>LR=0.1</code>" in page.text
    assert "10 分" in page.text  # max runtime
    assert f'data-log-src="/api/v1/jobs/{job_id}/logs"' in page.text
    assert 'id="cancel-job"' in page.text and 'action="/jobs/' + job_id + '/cancel"' in page.text


def test_blank_name_and_cpu_only(client: TestClient) -> None:
    browser = browser_user(client)
    job_id = submitted_id(submit_form(browser, name="", gpus_per_node="0"))
    job = browser.get(f"/api/v1/jobs/{job_id}").json()
    assert job["name"] == "job" and job["gpus_per_node"] == 0 and job["gpu_product"] is None


def test_providers_cannot_use_the_job_pages(client: TestClient) -> None:
    provider = browser_user(client, "farm@example.com", "provider")
    assert 'href="/jobs"' not in provider.get("/account").text
    for path in ("/jobs", "/jobs/new", "/jobs/fragment"):
        assert provider.get(path).status_code == 403, path
    token = csrf(provider, "/account")
    response = provider.post("/jobs/new", data={"csrf_token": token, **VALID})
    assert response.status_code == 403
    assert "您没有权限访问此页面。" in response.text


def test_pages_need_a_sign_in(client: TestClient) -> None:
    for path in ("/jobs", "/jobs/new", "/jobs/abc"):
        response = client.get(path, follow_redirects=False)
        assert response.status_code == 303
        assert response.headers["location"] == f"/login?next={path}"
    assert client.get("/jobs/fragment").status_code == 401
    assert client.get("/jobs/abc/fragment").status_code == 401


def test_users_start_on_their_jobs_with_the_nav_link(client: TestClient) -> None:
    browser = browser_user(client)
    assert browser.get("/", follow_redirects=False).headers["location"] == "/jobs"
    page = browser.get("/jobs").text
    assert '<a href="/jobs" class="active">任务</a>' in page


# ---- the list -------------------------------------------------------------------------------


def test_empty_list_says_how_to_submit(client: TestClient) -> None:
    browser = browser_user(client)
    page = browser.get("/jobs")
    assert page.status_code == 200
    assert "还没有任务" in page.text
    assert 'href="/jobs/new"' in page.text
    assert "sxwl jobs submit --gpus 1 -- python3 train.py" in page.text
    assert 'data-shape="empty"' in page.text
    assert 'data-live-src="/jobs/fragment"' in page.text


def test_list_tabs_search_and_pages(client: TestClient) -> None:
    browser = browser_user(client)
    headers = login(client, "dev@example.com")
    ids = []
    for i in range(25):
        response = client.post(
            "/api/v1/jobs",
            headers=headers,
            json={"name": f"sweep-{i:02d}", "command": "true", "gpus_per_node": 4, "gpu_product": PRODUCT},
        )
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])
    for job_id in ids[:3]:
        assert client.post(f"/api/v1/jobs/{job_id}/cancel", headers=headers).status_code == 200

    page = browser.get("/jobs").text
    assert rows(page) == ids[::-1][:20]  # newest first, 20 a page
    assert "第 1 / 2 页" in page and "共 25 个" in page
    assert re.search(r'data-view="queued"[^>]*>排队中 <span class="tab-count">22</span>', page)
    assert re.search(r'data-view="finished"[^>]*>已结束 <span class="tab-count">3</span>', page)
    assert re.search(r'data-view="active"[^>]*>进行中 <span class="tab-count">0</span>', page)
    assert 'href="/jobs?page=2"' in page
    assert rows(browser.get("/jobs?page=2").text) == ids[::-1][20:]
    assert ">4×4 NVIDIA-A100-SXM4-80GB<" not in page and f">1×4 {PRODUCT}<" in page
    assert "排队第 " in page

    finished = browser.get("/jobs?view=finished").text
    assert rows(finished) == ids[:3][::-1]
    assert finished.count(">已取消<") == 3
    assert rows(browser.get("/jobs?view=queued").text) == ids[3:][::-1][:20]
    assert browser.get("/jobs?view=active").text.count("没有符合条件的任务。") == 1

    assert rows(browser.get("/jobs?q=sweep-07").text) == [ids[7]]
    assert rows(browser.get(f"/jobs?q={ids[11][:10]}").text) == [ids[11]]
    assert rows(browser.get("/jobs?q=nothing-like-this").text) == []
    assert rows(browser.get("/jobs?view=finished&q=sweep-01").text) == [ids[1]]

    fragment = browser.get("/jobs/fragment?view=finished")
    assert fragment.status_code == 200
    assert fragment.text.lstrip().startswith("{#") is False and 'class="live-root"' in fragment.text
    assert rows(fragment.text) == ids[:3][::-1]
    # Bad parameters fall back instead of failing.
    assert browser.get("/jobs?view=nonsense&page=x").status_code == 200


def test_admin_sees_everyones_jobs_with_the_toggle(client: TestClient) -> None:
    user = browser_user(client)
    mine = submitted_id(submit_form(user, name="users-job"))
    make_admin(client, "root@example.com")
    admin = TestClient(client.app)
    token = csrf(admin, "/login")
    response = admin.post(
        "/login",
        data={"csrf_token": token, "email": "root@example.com", "password": "admin password"},
        follow_redirects=False,
    )
    assert response.status_code == 303
    own = admin.get("/jobs").text
    assert '<a href="/jobs" class="active">任务</a>' in own and "所有用户" in own
    assert rows(own) == []
    everyone = admin.get("/jobs?all=1").text
    assert rows(everyone) == [mine]
    # The address wraps before its "@" in a narrow column, not at any letter.
    assert (
        '<td class="job-owner" title="dev@example.com"><span class="email">dev</span><wbr>' in everyone
        and "提交者" in everyone
    )
    assert 'href="/jobs?all=1&amp;page=2"' not in everyone  # one page
    assert admin.get(f"/jobs/{mine}").status_code == 200  # admins may open any job
    assert 'dev</span><wbr><span class="email">@example.com' in admin.get(f"/jobs/{mine}").text
    # The same toggle means nothing for a user.
    user_view = user.get("/jobs?all=1").text
    assert rows(user_view) == [mine] and "所有用户" not in user_view


# ---- one job, and cancel ------------------------------------------------------------------


def test_another_users_job_is_403_and_a_missing_one_404(client: TestClient) -> None:
    owner = browser_user(client)
    job_id = submitted_id(submit_form(owner))
    other = browser_user(client, "other@example.com")
    assert other.get(f"/jobs/{job_id}").status_code == 403
    assert other.get(f"/jobs/{job_id}/fragment").status_code == 403
    token = csrf(other, "/jobs")
    assert other.post(f"/jobs/{job_id}/cancel", data={"csrf_token": token}).status_code == 403
    assert owner.get(f"/api/v1/jobs/{job_id}").json()["state"] == "queued"
    assert other.get("/jobs/doesnotexist").status_code == 404
    assert rows(other.get("/jobs").text) == []


def test_cancel_a_queued_job(client: TestClient) -> None:
    browser = browser_user(client)
    job_id = submitted_id(submit_form(browser))
    token = csrf(browser, f"/jobs/{job_id}")
    forged = browser.post(f"/jobs/{job_id}/cancel", data={"csrf_token": "forged"})
    assert forged.status_code == 403 and "页面已过期" in forged.text
    assert browser.get(f"/api/v1/jobs/{job_id}").json()["state"] == "queued"

    response = browser.post(f"/jobs/{job_id}/cancel", data={"csrf_token": token}, follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"] == f"/jobs/{job_id}?notice=job_cancelled"
    job = browser.get(f"/api/v1/jobs/{job_id}").json()
    assert job["state"] == "cancelled" and job["reason"] == "cancelled by dev@example.com"
    page = browser.get(response.headers["location"]).text
    assert "任务已取消。" in page and 'data-state="cancelled"' in page
    assert "由 dev@example.com 取消" in page
    assert 'id="cancel-job"' not in page  # nothing left to cancel
    assert 'data-kind="cancelled"' in page and 'data-kind="submitted"' in page


def test_cancel_of_a_finished_job_shows_the_conflict(client: TestClient) -> None:
    agent = online_cpod(client, gpus=8)
    browser = browser_user(client)
    job_id = submitted_id(submit_form(browser, gpu_product=PRODUCT, gpus_per_node="1"))
    token = csrf(browser, f"/jobs/{job_id}")
    assignment = eventually(
        lambda: client.get("/api/v1/agent/assignments?wait=1", headers=agent).json()["assignments"],
        what="the assignment",
    )[0]
    attempt = assignment["attempt"]

    def report(state: str, **extra: Any) -> None:
        response = client.post(
            f"/api/v1/agent/jobs/{job_id}/status",
            headers=agent,
            json={"attempt": attempt, "state": state, **extra},
        )
        assert response.status_code == 200, response.text

    report("running")
    log = client.post(
        f"/api/v1/agent/jobs/{job_id}/logs?attempt={attempt}&offset=0", headers=agent, content=b"step 1\n"
    )
    assert log.status_code == 200, log.text
    running = browser.get(f"/jobs/{job_id}").text
    assert 'data-state="running"' in running and ">运行中<" in running
    assert "任务结束后，写入 $SXWL_OUTPUT_DIR 的文件会出现在这里。" in running
    put = client.put(
        f"/api/v1/agent/jobs/{job_id}/artifacts/ckpt/model%20final.bin?attempt={attempt}",
        headers=agent,
        content=b"x" * 2048,
    )
    assert put.status_code == 201, put.text
    report("succeeded", exit_code=0)

    page = browser.get(f"/jobs/{job_id}").text
    assert 'data-state="succeeded"' in page and ">成功<" in page
    assert f'href="/api/v1/jobs/{job_id}/artifacts/ckpt/model%20final.bin" download' in page
    assert "2 KiB" in page
    assert (
        'data-kind="assigned"' in page and 'data-kind="running"' in page and 'data-kind="succeeded"' in page
    )
    assert 'id="cancel-job"' not in page
    download = browser.get(f"/api/v1/jobs/{job_id}/artifacts/ckpt/model%20final.bin")
    assert download.status_code == 200 and download.content == b"x" * 2048  # the cookie is enough

    response = browser.post(f"/jobs/{job_id}/cancel", data={"csrf_token": token}, follow_redirects=False)
    assert response.status_code == 409
    assert "任务已经结束（成功），无法取消。" in response.text
    assert 'data-state="succeeded"' in response.text  # the job's page, with the message in place
    assert browser.get(f"/api/v1/jobs/{job_id}").json()["state"] == "succeeded"


def test_cancel_of_a_running_job_is_a_request(client: TestClient) -> None:
    agent = online_cpod(client, gpus=8)
    browser = browser_user(client)
    job_id = submitted_id(submit_form(browser, gpus_per_node="1"))
    eventually(
        lambda: client.get("/api/v1/agent/assignments?wait=1", headers=agent).json()["assignments"],
        what="the assignment",
    )
    token = csrf(browser, f"/jobs/{job_id}")
    response = browser.post(f"/jobs/{job_id}/cancel", data={"csrf_token": token}, follow_redirects=False)
    assert response.headers["location"] == f"/jobs/{job_id}?notice=job_cancel_requested"
    page = browser.get(response.headers["location"]).text
    assert "已请求取消，CPod 正在停止任务。" in page
    assert "正在取消…" in page and 'id="cancel-job"' not in page
    assert 'data-kind="cancel_requested"' in page


def test_a_lost_attempt_shows_its_log_selector_and_timeline(client: TestClient) -> None:
    agent = online_cpod(client, gpus=8)
    browser = browser_user(client)
    job_id = submitted_id(submit_form(browser, gpus_per_node="1"))

    def assigned() -> dict[str, Any]:
        found: list[dict[str, Any]] = eventually(
            lambda: client.get("/api/v1/agent/assignments?wait=1", headers=agent).json()["assignments"],
            what="an assignment",
        )
        return found[0]

    first = assigned()
    assert first["attempt"] == 1
    status = client.post(
        f"/api/v1/agent/jobs/{job_id}/status", headers=agent, json={"attempt": 1, "state": "running"}
    )
    assert status.status_code == 200, status.text
    client.post(f"/api/v1/agent/jobs/{job_id}/logs?attempt=1&offset=0", headers=agent, content=b"try one\n")
    lost = client.post(
        f"/api/v1/agent/jobs/{job_id}/status",
        headers=agent,
        json={"attempt": 1, "state": "lost", "reason": "the node rebooted"},
    )
    assert lost.status_code == 200, lost.text
    assert assigned()["attempt"] == 2

    page = browser.get(f"/jobs/{job_id}").text
    assert '<select id="log-attempt"' in page
    assert '<option value="">第 2 次尝试</option><option value="1">第 1 次尝试</option>' in page
    assert 'data-kind="lost"' in page and 'data-kind="requeued"' in page
    assert "重新排队" in page and "the node rebooted" in page
    assert "第 2 次（最多 3 次）" in page
    old = browser.get(f"/api/v1/jobs/{job_id}/logs?attempt=1")  # what the selector reads
    assert old.text == "try one\n" and old.headers["X-Log-Complete"] == "true"


# ---- words ----------------------------------------------------------------------------------


def test_every_text_exists_in_both_languages() -> None:
    assert set(MESSAGES["zh"]) == set(MESSAGES["en"])
    for state in jobs_view.STATES:
        assert f"job.state.{state}" in MESSAGES["zh"]
    names = [jobs_view.state_name("zh", s) for s in jobs_view.STATES]
    assert names == ["排队中", "已分配", "启动中", "运行中", "成功", "失败", "已取消", "丢失"]


@pytest.mark.parametrize(
    ("seconds", "zh", "en"),
    [
        (None, "—", "—"),
        (0, "0 秒", "0 s"),
        (59, "59 秒", "59 s"),
        (61, "1 分 1 秒", "1 min 1 s"),
        (3600, "1 小时", "1 h"),
        (3725, "1 小时 2 分", "1 h 2 min"),
        (90000, "1 天 1 小时", "1 d 1 h"),
    ],
)
def test_durations(seconds: int | None, zh: str, en: str) -> None:
    assert jobs_view.duration("zh", seconds) == zh
    assert jobs_view.duration("en", seconds) == en


GPUS = Reason.of("need.gpus", gpus=2, product=PRODUCT)


@pytest.mark.parametrize(
    ("said", "en", "zh"),
    [
        (Reason.of("queue.scheduler"), "waiting for the scheduler", "等待调度"),
        (
            Reason.of("queue.never_fits", need=GPUS),
            f"no online CPod offers 2 × {PRODUCT}",
            f"没有在线的 CPod 能提供 2 × {PRODUCT}",
        ),
        (
            Reason.of(
                "queue.never_fits",
                need=Reason.of("need.nodes", nodes=3, each=Reason.of("need.gpus_any", gpus=8)),
            ),
            "no online CPod offers 3 nodes with 8 × GPU each",
            "没有在线的 CPod 能提供 3 个节点、每个 8 × GPU",
        ),
        (
            Reason.of("queue.busy", need=Reason.of("need.cpu")),
            "waiting for a CPU-only node to become free",
            "等待 仅 CPU 的节点 空闲",
        ),
        (
            Reason.of("queue.limit", limit=8, used=8),
            "your limit of 8 concurrent GPUs is reached (8 in use)",
            "已达到您的并发 GPU 上限 8（已使用 8）",
        ),
        (Reason.of("job.exit_code", code=3), "exit code 3", "退出码 3"),
        (
            Reason.of("queue.requeued", why=Reason.of("job.cpod_offline", cpod="abc")),
            "queued again: CPod abc went offline",
            "重新排队：CPod abc 已离线",
        ),
        (
            Reason.of("agent.max_runtime", seconds=60),
            "max runtime of 60 s exceeded",
            "超过最长运行时间（60 秒）",
        ),
        # A row written before the codes: its words, as stored, in every language.
        (Reason.read("something new"), "something new", "something new"),
    ],
)
def test_reasons_in_both_languages(said: Reason, en: str, zh: str) -> None:
    assert english(said) == en
    assert jobs_view.reason("zh", said) == zh
    assert jobs_view.reason("en", said) == en


def test_sizes() -> None:
    assert [jobs_view.size(n) for n in (0, 1023, 2048, 5 * 1024 * 1024)] == [
        "0 B",
        "1023 B",
        "2 KiB",
        "5 MiB",
    ]
