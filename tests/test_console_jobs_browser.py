"""任务 in a real browser: `sxwl serve` and `sxwl-agent` (with simulated GPUs) as real processes.

A compute user signs up through the form, submits a job through the submit form, watches its log
and its state change live (no reload), downloads its artifact, then cancels a long job through the
confirmation dialog. Screenshots go to test-artifacts/screenshots/.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import (
    Browser,
    BrowserContext,
    Page,
    ViewportSize,
    expect,
)

from tests.support.agent import AgentProcess, eventually
from tests.support.browser import (
    api_access_key,
    api_cpods,
    api_register,
    api_token,
    fits_width,
    new_context,
    register_in_form,
    screenshot,
    sign_in,
)
from tests.support.cloud import CloudProcess
from tests.support.net import free_port

pytestmark = pytest.mark.browser

PRODUCT = "SIM-A100-80GB"
USER = "trainer@example.com"
STEPS = "for i in 1 2 3; do echo step $i; sleep 0.3; done; echo done > $SXWL_OUTPUT_DIR/result.txt"
LIVE_MS = 30_000


@dataclass(frozen=True)
class Cloud:
    url: str
    data_dir: Path


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cloud]:
    """The cloud, and one CPod: a real agent on this machine declaring two simulated GPUs."""
    root = tmp_path_factory.mktemp("jobs-browser")
    env = {
        "SXWL_HEARTBEAT_INTERVAL_MIN_S": "0.2",
        "SXWL_RATE_REGISTER_IP": "100/3600",
        "SXWL_RATE_LOGIN_IP": "300/60",
    }
    process = CloudProcess(root / "data", free_port(), env=env)
    agent: AgentProcess | None = None
    try:
        api_register(process.url, "farm@example.com", "provider")
        token = api_token(process.url, "farm@example.com")
        key = api_access_key(process.url, token)
        agent = AgentProcess(
            process.url,
            root / "agent-state",
            key,
            "--simulate-gpus",
            "2",
            "--simulate-gpu-product",
            PRODUCT,
            "--heartbeat-interval",
            "0.3",
            "--stop-grace",
            "2",
            "--name",
            "sim-cpod",
        )
        eventually(
            lambda: [
                c for c in api_cpods(process.url, token) if c["status"] == "online" and c["gpu_summary"]
            ],
            timeout=30,
            what="the simulated CPod to be online",
        )
        yield Cloud(process.url, root / "data")
    finally:
        if agent is not None:
            agent.stop()
        process.stop()


@pytest.fixture
def context(browser: Browser, cloud: Cloud) -> Iterator[BrowserContext]:
    context = new_context(browser, cloud.url)
    try:
        yield context
    finally:
        context.close()


def job_state(page: Page) -> str:
    return page.locator("#job-state").get_attribute("data-state") or ""


JOB_PAGE = re.compile(r"/jobs/((?!new$)[0-9a-z]+)$")


def submit_job(page: Page, name: str, command: str, gpus: str = "1") -> str:
    """Fills the form and submits it; returns the new job's id from the job page's URL."""
    page.goto("/jobs/new")
    page.locator("#f-name").fill(name)
    page.locator("#f-command").fill(command)
    page.locator("#f-gpu_product").select_option(PRODUCT)
    page.locator("#f-gpus_per_node").fill(gpus)
    page.get_by_role("button", name="提交任务", exact=True).click()
    # The job's page, without the notice's query: shown once, a reload does not repeat it.
    expect(page).to_have_url(JOB_PAGE)
    match = JOB_PAGE.search(page.url)
    assert match
    return match.group(1)


def test_submit_watch_download_and_cancel(context: BrowserContext, cloud: Cloud) -> None:
    page = context.new_page()
    register_in_form(page, "user", USER)
    nav = page.get_by_role("navigation", name="main")
    nav.get_by_role("link", name="任务").click()
    expect(page).to_have_url(re.compile(r"/jobs$"))
    expect(page.get_by_role("heading", name="还没有任务")).to_be_visible()
    expect(page.locator("#cli-example")).to_have_text("sxwl jobs submit --gpus 1 -- python3 train.py")
    screenshot(page, "jobs-empty")

    # The form: what is wrong is said next to each field, and what was typed stays.
    page.locator(".jobs-empty").get_by_role("link", name="提交任务").click()
    expect(page).to_have_url(re.compile(r"/jobs/new$"))
    product = page.locator("#f-gpu_product")
    expect(product.locator(f'option[value="{PRODUCT}"]')).to_have_text(f"{PRODUCT} · 80 GiB（可用 2 / 共 2）")
    page.locator("#f-name").fill("three-steps")
    page.locator("#f-gpus_per_node").fill("-1")
    page.locator("#f-env").fill("GREETING=hello\nnot a variable")
    page.get_by_role("button", name="提交任务", exact=True).click()
    expect(page.locator("#e-command")).to_have_text("请输入要运行的命令。")
    expect(page.locator("#e-gpus_per_node")).to_have_text("请输入 0 到 64 之间的整数。")
    expect(page.locator("#e-env")).to_have_text("第 2 行：应为 KEY=VALUE 格式")
    expect(page.locator("#f-name")).to_have_value("three-steps")
    expect(page.locator("#f-env")).to_have_value("GREETING=hello\nnot a variable")
    screenshot(page, "job-form-errors")

    page.locator("#f-command").fill(STEPS)
    page.locator("#f-gpus_per_node").fill("1")
    page.locator("#f-env").fill("GREETING=hello")
    product.select_option(PRODUCT)
    page.get_by_role("button", name="提交任务", exact=True).click()
    expect(page).to_have_url(JOB_PAGE)
    job_url = page.url

    # Live: the log grows and the state changes without a reload.
    page.evaluate("window.__sameDocument = true")
    log = page.locator("#job-log")
    expect(log).to_contain_text("step 3", timeout=LIVE_MS)
    expect(log).to_contain_text("step 1\nstep 2\nstep 3")
    state = page.locator("#job-state")
    expect(state).to_have_attribute("data-state", "succeeded", timeout=LIVE_MS)
    expect(state).to_have_text("成功")
    expect(log).to_have_attribute("data-complete", "true", timeout=LIVE_MS)
    expect(log).to_have_text("step 1\nstep 2\nstep 3\n")  # each line once
    expect(page.locator("#log-status")).to_have_text("已结束")
    assert page.evaluate("window.__sameDocument") is True
    timeline = page.locator("#timeline")
    for kind in ("submitted", "assigned", "running", "succeeded"):
        expect(timeline.locator(f'li[data-kind="{kind}"]')).to_have_count(1)
    expect(page.locator("#cancel-job")).to_have_count(0)
    # "Submitted" went with the state it was said in; a finished job's cost is its cost, not "so far".
    expect(page.locator("#job-notice")).to_have_count(0)
    expect(page.get_by_role("status")).to_have_count(0)

    artifact = page.locator('#artifacts tr[data-path="result.txt"]')
    expect(artifact).to_be_visible(timeout=LIVE_MS)
    expect(artifact).to_contain_text("5 B")
    with page.expect_download() as info:
        artifact.get_by_role("link", name="下载").click()
    download = info.value
    assert download.suggested_filename == "result.txt"
    assert Path(download.path()).read_text() == "done\n"
    screenshot(page, "job-succeeded")

    # The list shows it; the page is the same after a reload.
    page.goto("/jobs")
    row = page.locator("#jobs tbody tr").first
    expect(row.locator(".job-name")).to_have_text("three-steps")
    expect(row.locator(".job-state")).to_have_text("成功")
    expect(row.locator(".job-gpus")).to_have_text(f"1×1 {PRODUCT}")

    # A long job: cancelled through the dialog while it runs.
    long_id = submit_job(page, "long-sleep", "echo sleeping; sleep 60")
    state = page.locator("#job-state")
    expect(state).to_have_attribute("data-state", "running", timeout=LIVE_MS)
    expect(page.locator("#job-log")).to_contain_text("sleeping", timeout=LIVE_MS)
    expect(state).to_have_text("运行中")
    screenshot(page, "job-running")

    # More GPUs than any CPod has: it waits, and says why and where it stands.
    waiting_id = submit_job(page, "needs-four", "python3 train.py", gpus="4")
    expect(page.locator("#job-state")).to_have_text("排队中")
    # Still queued: the banner of its submission stays while that lasts (and a refresh keeps it).
    notice = page.locator("#job-notice")
    expect(notice).to_have_text("任务已提交。")
    expect(notice).to_have_attribute("data-while-state", "queued")
    expect(page.locator("#job-reason")).to_contain_text("排队第 1 位")
    expect(page.locator("#job-reason")).to_contain_text(
        f"没有在线的 CPod 能提供 4 × {PRODUCT}", timeout=LIVE_MS
    )
    expect(page.locator("#job-log")).to_have_attribute(
        "data-placeholder", "任务开始运行后，输出会实时显示在这里。"
    )

    page.goto("/jobs")
    expect(page.locator(f'#jobs tr[data-key="{long_id}"] .job-state')).to_have_text("运行中")
    waiting = page.locator(f'#jobs tr[data-key="{waiting_id}"]')
    expect(waiting.locator(".job-state")).to_have_text("排队中")
    expect(waiting.locator(".job-note")).to_contain_text(f"排队第 1 位没有在线的 CPod 能提供 4 × {PRODUCT}")
    expect(page.locator('.tab[data-view="active"] .tab-count')).to_have_text("1")
    expect(page.locator('.tab[data-view="queued"] .tab-count')).to_have_text("1")
    screenshot(page, "jobs-list")
    page.locator('.tab[data-view="queued"]').click()
    expect(page.locator("#jobs tbody tr")).to_have_count(1)
    page.goto("/jobs")

    page.goto(f"/jobs/{long_id}")
    dialog = page.locator("#cancel-dialog")
    page.locator("#cancel-job").click()
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("取消任务「long-sleep」？")
    dialog.get_by_role("button", name="不取消").click()
    expect(dialog).to_be_hidden()
    page.locator("#cancel-job").click()
    screenshot(page, "job-cancel-dialog", full_page=False)
    dialog.get_by_role("button", name="确认取消").click()
    expect(page).to_have_url(re.compile(rf"/jobs/{long_id}$"))
    expect(state).to_have_attribute("data-state", "cancelled", timeout=LIVE_MS)
    expect(page.get_by_text("CPod 正在停止任务")).to_have_count(0)  # done: "stopping" is no longer said
    expect(state).to_have_text("已取消")
    expect(page.locator('#timeline li[data-kind="cancel_requested"]')).to_have_count(1)
    expect(page.locator("#job-log")).to_have_attribute("data-complete", "true", timeout=LIVE_MS)

    # The first job's page, opened afresh, reads the whole log at once.
    page.goto(job_url)
    expect(page.locator("#job-log")).to_have_text("step 1\nstep 2\nstep 3\n")


def test_english_and_a_narrow_screen(browser: Browser, cloud: Cloud) -> None:
    email = "narrow@example.com"
    api_register(cloud.url, email, "user")
    context = new_context(browser, cloud.url, locale="en-US")
    try:
        page = context.new_page()
        sign_in(page, email)
        page.goto("/lang/en?next=/jobs/new")
        expect(page.locator("html")).to_have_attribute("lang", "en")
        expect(page.get_by_role("heading", name="Submit a job")).to_be_visible()
        expect(page.get_by_text("Max runtime (minutes)")).to_be_visible()
        page.locator("#f-name").fill("hello-en")
        page.locator("#f-command").fill("echo hello from the console")
        page.locator("#f-gpus_per_node").fill("0")
        page.get_by_role("button", name="Submit", exact=True).click()
        expect(page).to_have_url(JOB_PAGE)
        state = page.locator("#job-state")
        expect(state).to_have_text("Succeeded", timeout=LIVE_MS)
        expect(page.locator("#job-log")).to_have_text("hello from the console\n", timeout=LIVE_MS)
        expect(page.locator('#timeline li[data-kind="succeeded"] .badge')).to_have_text("Succeeded")
        expect(page.locator("#log-status")).to_have_text("Complete")
        screenshot(page, "job-succeeded-en")
        page.get_by_role("navigation", name="main").get_by_role("link", name="Jobs").click()
        expect(page.locator("#jobs tbody tr")).to_have_count(1)
        expect(page.locator("#jobs .job-gpus")).to_have_text("CPU only")
        screenshot(page, "jobs-list-en")
    finally:
        context.close()

    context = new_context(browser, cloud.url, viewport=ViewportSize(width=390, height=844))
    try:
        page = context.new_page()
        sign_in(page, email)
        page.goto("/lang/zh?next=/")
        expect(page).to_have_url(re.compile(r"/jobs$"))  # a compute user's start page
        expect(page.locator("#jobs tbody tr")).to_have_count(1)
        assert fits_width(page, 390)
        screenshot(page, "jobs-list-390px")
        page.locator("#jobs .job-name", has_text="hello-en").click()
        expect(page.locator("#job-state")).to_have_text("成功")
        expect(page.locator("#job-log")).to_contain_text("hello from the console")
        assert fits_width(page, 390)
        screenshot(page, "job-390px")
        page.goto("/jobs/new")
        assert fits_width(page, 390)
        screenshot(page, "job-form-390px")
    finally:
        context.close()
