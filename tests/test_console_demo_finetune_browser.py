"""The README's promise, as a new user meets it: `sxwl up` (its demo accounts, the tiny model, the
sample dataset, this machine as a CPod with no GPU, a real agent and the real trainer on CPUs), then
in a real browser the demo user opens 新建微调 and starts the fine-tune without touching a field, and
watches it succeed. The form's defaults must fit the CPod that is online (0 GPUs here), or the
fine-tune waits for ever. Screenshots of the form and the finished page at desktop and phone widths
go to the test's tmp dir and test-artifacts/screenshots/."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, ViewportSize, expect

from sxwl.cli.demo_finetune import DEMO_DATASET, DEMO_MODEL
from sxwl.cli.demo_money import local_gpu_products
from sxwl.cli.server import DEMO_USER
from tests.support.agent import eventually
from tests.support.browser import fits_width, new_context, screenshot, sign_in
from tests.support.cloud import CloudProcess
from tests.support.net import free_port

pytest.importorskip("peft", reason="the demo fine-tune needs the training extra: pip install -e '.[train]'")
pytestmark = pytest.mark.browser

DEMO_PROVIDER = "provider@demo.example.com"
PHONE = ViewportSize(width=390, height=844)
# The whole run on a busy CPU: the model's load, 30 steps (40 examples, batch 4, 3 epochs), three
# checkpoints and the adapter.
RUN_MS = 420_000


@dataclass(frozen=True)
class Demo:
    url: str
    password: str  # the demo user's, new on every start
    provider_password: str


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    root = tmp_path_factory.mktemp("demo-finetune")
    port = free_port()
    env = {
        **os.environ,
        "SXWL_ARGON2_TIME_COST": "1",
        "SXWL_ARGON2_MEMORY_KIB": "1024",
        "COLUMNS": "200",
    }
    log_path = root / "up.log"
    with log_path.open("w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sxwl.cli", "up", "--port", str(port), "--data-dir", str(root / "data")],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            CloudProcess.wait_for(url, proc, log_path, timeout=300)
            logins = dict(
                re.findall(r"│ \w+\s+│ (\S+@demo\.example\.com)\s+│ (\S+)\s+│", log_path.read_text())
            )
            yield Demo(url, logins[DEMO_USER], logins[DEMO_PROVIDER])
        finally:
            os.killpg(proc.pid, signal.SIGTERM)  # `sxwl up` stops its agent too
            proc.wait(30)


def token(demo: Demo, email: str, password: str) -> dict[str, str]:
    response = httpx.post(f"{demo.url}/api/v1/auth/login", json={"email": email, "password": password})
    assert response.status_code == 200, response.text
    return {"Authorization": f"Bearer {response.json()['access_token']}"}


def shot(page: Page, tmp_path: Path, name: str, width: int) -> None:
    assert fits_width(page, width), f"{name} scrolls sideways at {width} px"
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
    screenshot(page, name)


def test_the_demo_fine_tune_starts_from_the_forms_defaults_and_succeeds(
    browser: Browser, demo: Demo, tmp_path: Path
) -> None:
    headers = token(demo, DEMO_USER, demo.password)
    # This machine's GPUs, as its CPod reports them: none on the laptop the README speaks of.
    gpus = "1" if local_gpu_products() else "0"
    eventually(lambda: _cpod_online(demo), timeout=120, what="this machine's CPod online")
    context = new_context(browser, demo.url)
    try:
        page = context.new_page()
        sign_in(page, DEMO_USER, demo.password)
        page.goto("/finetune")
        page.locator("#empty-new").click()
        expect(page).to_have_url(re.compile(r"/finetune/new$"))
        # Everything a first fine-tune needs is chosen: the demo model and dataset, and CPUs where
        # the only CPod has no GPU.
        expect(page.locator("#f-model")).to_have_value(DEMO_MODEL)
        expect(page.locator("#f-training_file option:checked")).to_contain_text(DEMO_DATASET)
        expect(page.locator("#f-gpus")).to_have_value(gpus)
        if gpus == "0":
            expect(page.locator("#h-gpus")).to_contain_text("都没有 GPU")
        shot(page, tmp_path, "demo-finetune-form", 1280)
        page.set_viewport_size(PHONE)
        shot(page, tmp_path, "demo-finetune-form-phone", PHONE["width"])
        page.set_viewport_size(ViewportSize(width=1280, height=800))

        page.locator("#submit-ft").click()
        expect(page).to_have_url(re.compile(r"/finetune/ftjob-[0-9a-f]+$"))  # the banner's query dropped
        fine_tune_id = page.url.rsplit("/", 1)[1].split("?")[0]
        expect(page.locator("#ft-status")).to_have_attribute("data-status", "succeeded", timeout=RUN_MS)
        expect(page.locator("#adapter-name")).to_have_text(re.compile(rf"^ft:{DEMO_MODEL}:"))
        page.reload()
        # One training loss: the summary's is the chart's last point.
        summary = page.locator("#ft-loss").inner_text()
        expect(page.locator(".legend-train b")).to_have_text(summary)
        shot(page, tmp_path, "demo-finetune-succeeded", 1280)
        page.set_viewport_size(PHONE)
        page.reload()
        shot(page, tmp_path, "demo-finetune-succeeded-phone", PHONE["width"])

        # The real trainer's checkpoints carry the losses it logged at their steps.
        api = f"{demo.url}/v1/fine_tuning/jobs/{fine_tune_id}"
        events = httpx.get(f"{api}/events", headers=headers, params={"limit": 100}).json()["data"]
        metrics = [e["data"] for e in events if e["type"] == "metrics" and e["data"]]
        logged = {data["step"]: data["loss"] for data in metrics if data["loss"] is not None}
        checkpoints = httpx.get(f"{api}/checkpoints", headers=headers).json()["data"]
        assert sorted(c["step_number"] for c in checkpoints) == [10, 20, 30]
        for c in checkpoints:
            assert c["metrics"]["train_loss"] == logged[c["step_number"]], c

        # "Fine-tune with it" on the files page names the file and keeps the other defaults.
        page.set_viewport_size(ViewportSize(width=1280, height=800))
        page.goto("/finetune/files")
        page.locator("a[href^='/finetune/new?training_file=']").first.click()
        expect(page.locator("#f-model")).to_have_value(DEMO_MODEL)
        expect(page.locator("#f-gpus")).to_have_value(gpus)
    finally:
        context.close()


def _cpod_online(demo: Demo) -> bool:
    """This machine's CPod is online (the provider's view; the demo user sees no CPods)."""
    provider = token(demo, DEMO_PROVIDER, demo.provider_password)
    cpods = httpx.get(f"{demo.url}/api/v1/cpods", headers=provider).json()
    return any(c["status"] == "online" for c in cpods)
