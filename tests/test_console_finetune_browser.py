"""微调 in a real browser: the cloud served by uvicorn (in this process, so the test can register a
model through the catalogue service), a priced CPod driven over the agent protocol by the test, and
a compute user who uploads a dataset (a bad line shown with its number, then a good file), fills the
form, lands on the fine-tune's page, and watches its progress bar and loss chart move as the
trainer's progress lines are appended to the job's log (no reload), then downloads the adapter.
Screenshots go to the test's tmp dir and test-artifacts/screenshots/."""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from playwright.sync_api import Browser, BrowserContext, FilePayload, Page, expect

from sxwl.cloud.app import create_app
from sxwl.protocol.finetune import ADAPTER_ARTIFACT, Progress, progress_line
from tests.support import cloud as cloud_support
from tests.support.agent import eventually
from tests.support.browser import fits_width, new_context, register_in_form, screenshot
from tests.support.cpods import access_key, gpu_node, register_cpod
from tests.support.served import Served
from tests.test_admin_api import make_admin
from tests.test_console_finetune import GOOD_LINES, MODEL, ctx_of, jsonl, register_model
from tests.test_console_jobs import PRODUCT

pytestmark = pytest.mark.browser

USER = "tuner@example.com"
LIVE_MS = 20_000
TOTAL = 60


@dataclass
class Agent:
    """A CPod as its agent would be: heartbeats from a thread (listing the attempts it runs, as the
    billing's proof of life needs), and the test's hand for assignments, states and log appends."""

    url: str
    token: str
    running: list[dict[str, Any]] = field(default_factory=list)
    offsets: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def beat(self, seq: int) -> None:
        node = gpu_node("w1", count=2, used=len(self.running))
        body = {"seq": seq, "nodes": [node], "jobs": list(self.running)}
        # A slow moment of the server: the next beat tries again.
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"{self.url}/api/v1/agent/heartbeat", headers=self.headers, json=body, timeout=10)

    def start(self) -> None:
        self.beat(1)

        def run() -> None:
            seq = 1
            while not self._stop.wait(0.5):
                seq += 1
                self.beat(seq)

        threading.Thread(target=run, name="ft-heartbeats", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = httpx.request(method, f"{self.url}{path}", headers=self.headers, timeout=30, **kwargs)
        assert response.status_code in (200, 201), response.text
        return response

    def take(self, job_id: str) -> int:
        def assigned() -> list[dict[str, Any]]:
            answer = self.call("GET", "/api/v1/agent/assignments?wait=1").json()["assignments"]
            return [a for a in answer if a["job_id"] == job_id]

        (assignment,) = eventually(assigned, timeout=30, what="the fine-tune's assignment")
        attempt: int = assignment["attempt"]
        for state in ("starting", "running"):
            self.call(
                "POST", f"/api/v1/agent/jobs/{job_id}/status", json={"attempt": attempt, "state": state}
            )
        self.running.append({"job_id": job_id, "attempt": attempt, "state": "running"})
        return attempt

    def progress(self, job_id: str, attempt: int, *lines: Progress) -> None:
        data = "".join(progress_line(p) + "\n" for p in lines).encode()
        offset = self.offsets.get(job_id, 0)
        self.call("POST", f"/api/v1/agent/jobs/{job_id}/logs?attempt={attempt}&offset={offset}", content=data)
        self.offsets[job_id] = offset + len(data)

    def succeed(self, job_id: str, attempt: int, adapter: bytes) -> None:
        self.call(
            "PUT",
            f"/api/v1/agent/jobs/{job_id}/artifacts/{ADAPTER_ARTIFACT}?attempt={attempt}",
            content=adapter,
        )
        self.running = [r for r in self.running if r["job_id"] != job_id]
        self.call(
            "POST",
            f"/api/v1/agent/jobs/{job_id}/status",
            json={"attempt": attempt, "state": "succeeded", "exit_code": 0},
        )


@dataclass(frozen=True)
class Cloud:
    url: str
    client: TestClient
    admin: dict[str, str]
    agent: Agent


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cloud]:
    root = tmp_path_factory.mktemp("finetune-browser")
    settings = cloud_support.test_settings(
        root / "data",
        f"sqlite:///{root / 'sxwl.db'}",
        billing_enabled=True,
        metering_interval_s=3600,
        heartbeat_interval_s=1.0,
        heartbeat_interval_min_s=0.2,
    )
    app = create_app(settings)
    with Served(app, settings) as served:
        client = TestClient(app)  # the same application: its lifespan is the served one's
        admin = make_admin(client)
        body = {"prices": [{"product": PRODUCT, "price_per_hour_yuan": "7.20", "fee_percent": "10"}]}
        assert client.put("/api/v1/admin/prices", headers=admin, json=body).status_code == 200
        register_model(ctx_of(client))
        provider = client.post(
            "/api/v1/auth/register",
            json={"email": "farm@example.com", "password": "correct horse", "role": "provider"},
        )
        assert provider.status_code == 201, provider.text
        login = client.post(
            "/api/v1/auth/login", json={"email": "farm@example.com", "password": "correct horse"}
        )
        key = access_key(client, {"Authorization": f"Bearer {login.json()['access_token']}"})
        agent = Agent(served.url, register_cpod(client, key)["cpod_token"])
        agent.start()
        try:
            yield Cloud(served.url, client, admin, agent)
        finally:
            agent.stop()


@pytest.fixture
def context(browser: Browser, cloud: Cloud) -> Iterator[BrowserContext]:
    context = new_context(browser, cloud.url)
    try:
        yield context
    finally:
        context.close()


def shot(page: Page, tmp_path: Path, name: str) -> Path:
    assert fits_width(page, 1280), f"{name} scrolls sideways"
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
    return screenshot(page, name)


def top_up(cloud: Cloud, email: str) -> None:
    users = cloud.client.get("/api/v1/admin/users", headers=cloud.admin, params={"q": email}).json()
    (user,) = [u for u in users["items"] if u["email"] == email]
    body = {"user_id": user["id"], "amount_yuan": "100", "note": "welcome"}
    assert cloud.client.post("/api/v1/admin/top-ups", headers=cloud.admin, json=body).status_code == 201


def test_upload_create_and_watch_a_fine_tune(context: BrowserContext, cloud: Cloud, tmp_path: Path) -> None:
    page = context.new_page()
    register_in_form(page, "user", USER)
    top_up(cloud, USER)
    page.get_by_role("navigation", name="main").get_by_role("link", name="微调").click()
    expect(page).to_have_url(re.compile(r"/finetune$"))
    expect(page.get_by_role("heading", name="还没有微调任务")).to_be_visible()
    shot(page, tmp_path, "finetune-empty")

    # A dataset with a bad line: its number and its problem, in place.
    page.locator("#empty-upload").click()
    expect(page).to_have_url(re.compile(r"/finetune/files$"))
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(jsonl(GOOD_LINES[0], b'{"messages": "hi"}', GOOD_LINES[1]))
    page.locator("#f-file").set_input_files(bad)
    page.locator("#upload-submit").click()
    result = page.locator("#upload-result")
    expect(result).to_have_attribute("data-status", "error")
    expect(page.locator("#upload-problems tbody tr")).to_have_count(1)
    expect(page.locator('#upload-problems tr[data-line="2"]')).to_contain_text("messages")
    shot(page, tmp_path, "finetune-upload-problems")

    good = tmp_path / "support.jsonl"
    good.write_bytes(jsonl(*GOOD_LINES * 10))
    page.locator("#f-file").set_input_files(good)
    page.locator("#upload-submit").click()
    expect(result).to_have_attribute("data-status", "processed")
    expect(result).to_contain_text("共 20 个样本")
    shot(page, tmp_path, "finetune-upload-ok")
    page.locator("#train-uploaded").click()

    # The form: an error in place first, then the fine-tune.
    expect(page).to_have_url(re.compile(r"/finetune/new\?training_file=file-"))
    expect(page.locator("#f-training_file option:checked")).to_contain_text("support.jsonl")
    page.locator("#f-model").select_option(MODEL)
    page.locator("#f-gpu_product").select_option(PRODUCT)
    page.locator("#f-gpus").fill("1")
    page.locator("#f-suffix").fill("support bot")
    page.locator("#f-n_epochs").fill("3")
    page.locator("#f-max_cost_yuan").fill("30")
    page.locator("#submit-ft").click()
    expect(page.locator("#e-suffix")).to_have_text("只能包含字母、数字、. _ -，最多 40 个字符。")
    expect(page.locator("#f-n_epochs")).to_have_value("3")
    shot(page, tmp_path, "finetune-form-errors")
    page.locator("#f-suffix").fill("support-bot")
    page.locator("#submit-ft").click()
    # The page drops the form's query once it has said what it did: a reload does not repeat it.
    expect(page).to_have_url(re.compile(r"/finetune/ftjob-[0-9a-f]+$"))
    expect(page.locator("#ft-notice")).to_have_text("微调已创建，正在排队等待 GPU。")
    fine_tune_id = page.url.rsplit("/", 1)[1]
    job_id = (page.locator(".job-sub a").get_attribute("href") or "").rsplit("/", 1)[1]

    # Live: the trainer's lines arrive through the agent API; the page follows without a reload.
    page.evaluate("window.__sameDocument = true")
    attempt = cloud.agent.take(job_id)
    expect(page.locator("#ft-status")).to_have_attribute("data-status", "running", timeout=LIVE_MS)
    expect(page.locator("#ft-notice")).to_have_count(0)  # no longer queued: "waiting for GPUs" went
    expect(page.locator("#loss-chart-empty")).to_be_visible()
    losses = [2.6, 2.3, 2.05, 1.9, 1.72, 1.6, 1.52, 1.41, 1.37, 1.3]
    cloud.agent.progress(
        job_id,
        attempt,
        Progress(kind="started"),
        *[
            Progress(kind="metrics", step=2 * i + 2, total_steps=TOTAL, loss=loss, elapsed_s=3.0 * i + 3)
            for i, loss in enumerate(losses[:5])
        ],
        Progress(kind="eval", step=10, total_steps=TOTAL, loss=1.72, eval_loss=1.85),
    )
    expect(page.locator("#ft-steps")).to_have_text(f"第 10 / {TOTAL} 步", timeout=LIVE_MS)
    expect(page.locator("#loss-chart #train-line")).to_be_visible()
    expect(page.locator("#loss-chart .dot-eval")).to_have_count(1)
    cloud.agent.progress(
        job_id,
        attempt,
        *[
            Progress(kind="metrics", step=2 * i + 12, total_steps=TOTAL, loss=loss, elapsed_s=3.0 * i + 18)
            for i, loss in enumerate(losses[5:])
        ],
        Progress(kind="eval", step=20, total_steps=TOTAL, loss=1.3, eval_loss=1.46),
    )
    bar = page.locator("#ft-progress progress")
    expect(bar).to_have_attribute("value", "20", timeout=LIVE_MS)
    expect(page.locator("#ft-percent")).to_have_text("33%")
    expect(page.locator("#loss-chart .dot-eval")).to_have_count(2)
    expect(page.locator("#loss-chart #eval-line")).to_be_visible()
    expect(page.locator("#ft-loss")).to_have_text("1.3000")
    expect(page.locator("#ft-eval-loss")).to_have_text("1.4600")
    expect(page.locator("#ft-events li").first).to_contain_text(
        "第 20/60 步：训练损失 1.3000，验证损失 1.4600"
    )
    expect(page.locator("#ft-cost")).to_have_text(re.compile(r"^¥\d+\.\d+$"))
    # 2 steps every 3 s by the trainer's clock: the 40 steps left take a minute from the last line.
    expect(page.locator("#ft-eta")).to_have_text(re.compile(r"约 (1 分|[45]\d 秒)"), timeout=LIVE_MS)
    assert page.evaluate("window.__sameDocument") is True
    shot(page, tmp_path, "finetune-running")

    # The list shows it with its bar.
    page.goto("/finetune")
    row = page.locator(f'#fine-tunes tr[data-key="{fine_tune_id}"]')
    expect(row).to_contain_text("support-bot")
    expect(row.locator("progress")).to_have_attribute("value", "20")
    shot(page, tmp_path, "finetune-list")

    # Done: the adapter appears on the page, live, and downloads with the console's session.
    page.goto(f"/finetune/{fine_tune_id}")
    page.evaluate("window.__sameDocument = true")
    cloud.agent.progress(job_id, attempt, Progress(kind="done", step=TOTAL, total_steps=TOTAL, loss=1.1))
    cloud.agent.succeed(job_id, attempt, b"adapter tar bytes")
    expect(page.locator("#ft-status")).to_have_attribute("data-status", "succeeded", timeout=40_000)
    expect(page.locator("#adapter-name")).to_have_text(
        f"ft:{MODEL}:support-bot:{fine_tune_id}", timeout=LIVE_MS
    )
    expect(page.locator("#cancel-ft")).to_have_count(0)
    with page.expect_download() as info:
        page.locator("#adapter-download").click()
    assert Path(info.value.path()).read_bytes() == b"adapter tar bytes"
    assert page.evaluate("window.__sameDocument") is True
    stats = page.locator(".ft-stats")
    expect(stats).to_contain_text("总费用")  # finished: its cost, no longer "so far"
    expect(stats).not_to_contain_text("已花费")
    shot(page, tmp_path, "finetune-succeeded")

    # 模型: the adapter, linked to its fine-tune, and the base model to fine-tune again.
    page.get_by_role("navigation", name="main").get_by_role("link", name="模型").click()
    expect(page).to_have_url(re.compile(r"/models$"))
    adapter = page.locator(f'#adapters [data-model="ft:{MODEL}:support-bot:{fine_tune_id}"]')
    expect(adapter).to_contain_text(MODEL)
    expect(page.locator(f'#base-models [data-model="{MODEL}"]')).to_contain_text("公共")
    shot(page, tmp_path, "models")
    page.set_viewport_size({"width": 390, "height": 844})
    assert fits_width(page, 390), "the models page scrolls sideways on a phone"
    screenshot(page, "models-390px")
    page.set_viewport_size({"width": 1280, "height": 800})
    adapter.locator(".model-fine-tune").click()
    expect(page).to_have_url(re.compile(rf"/finetune/{fine_tune_id}$"))

    # 数据集: the bad file goes through its confirmation; the one the fine-tune used is refused in place.
    page.goto("/finetune/files")
    bad_row = page.locator("#files tbody tr[data-key]", has_text="bad.jsonl")
    bad_row.locator(".file-delete").click()
    dialog = page.locator("dialog[open]")
    expect(dialog).to_contain_text("删除数据集“bad.jsonl”？")
    screenshot(page, "finetune-files-delete-dialog", full_page=False)
    dialog.locator(".delete-confirm").click()
    expect(page.locator("#files-notice")).to_have_text("数据集“bad.jsonl”已删除。")
    expect(page).to_have_url(re.compile(r"/finetune/files$"))
    expect(page.locator("#files tbody tr[data-key]", has_text="bad.jsonl")).to_have_count(0)
    used_row = page.locator("#files tbody tr[data-key]", has_text="support.jsonl")
    used_row.locator(".file-delete").click()
    page.locator("dialog[open] .delete-confirm").click()
    expect(page.locator("#files-error")).to_have_text(
        f"数据集“support.jsonl”正被微调 {fine_tune_id} 使用，不能删除：微调的记录需要它。"
    )
    expect(used_row).to_be_visible()
    shot(page, tmp_path, "finetune-files-in-use")
    page.set_viewport_size({"width": 390, "height": 844})
    assert fits_width(page, 390), "the datasets page scrolls sideways on a phone"
    screenshot(page, "finetune-files-390px")
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"/finetune/{fine_tune_id}")

    # A phone: nothing scrolls sideways, the chart scales down with its card.
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    expect(page.locator("#loss-chart")).to_be_visible()
    assert fits_width(page, 390), "the fine-tune's page scrolls sideways on a phone"
    page.screenshot(path=str(tmp_path / "finetune-phone.png"), full_page=True)
    page.locator(".chart-card").screenshot(path=str(tmp_path / "finetune-phone-chart.png"))
    page.goto("/finetune")
    assert fits_width(page, 390), "the list scrolls sideways on a phone"


def test_cancel_a_queued_fine_tune_through_the_dialog(
    context: BrowserContext, cloud: Cloud, tmp_path: Path
) -> None:
    page = context.new_page()
    register_in_form(page, "user", "canceller@example.com")
    top_up(cloud, "canceller@example.com")
    page.goto("/finetune/files")
    dataset: FilePayload = {"name": "t.jsonl", "mimeType": "application/jsonl", "buffer": jsonl(*GOOD_LINES)}
    page.locator("#f-file").set_input_files(files=dataset)
    page.locator("#upload-submit").click()
    page.locator("#train-uploaded").click()
    page.locator("#f-model").select_option(MODEL)
    page.locator("#f-gpus").fill("0")  # on CPUs: no CPod offers that, so it stays queued
    page.locator("#submit-ft").click()
    expect(page).to_have_url(re.compile(r"/finetune/ftjob-[0-9a-f]+$"))
    # It says what it waits for, live (the scheduler's reason, in the page's language).
    expect(page.locator("#ft-reason")).to_contain_text("排队原因：", timeout=LIVE_MS)
    expect(page.locator("#ft-reason .reason")).not_to_be_empty()
    shot(page, tmp_path, "finetune-queued")
    page.set_viewport_size({"width": 390, "height": 844})
    assert fits_width(page, 390), "the queued fine-tune's page scrolls sideways on a phone"
    screenshot(page, "finetune-queued-phone")
    page.set_viewport_size({"width": 1280, "height": 800})
    page.locator("#cancel-ft").click()
    expect(page.locator("#cancel-dialog")).to_be_visible()
    page.locator("#cancel-confirm").click()
    expect(page).to_have_url(re.compile(r"/finetune/ftjob-[0-9a-f]+$"))
    expect(page.locator("#ft-status")).to_have_text("已取消")
