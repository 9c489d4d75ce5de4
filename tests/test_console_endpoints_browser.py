"""Deploy and the Playground in Chromium (docs/endpoints.md): from the Models page's Deploy button
to a ready endpoint, then a chat streamed in the Playground, against a served cloud and a real agent
whose vLLM is the recording stand-in (tests/test_endpoints_vllm.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.support.browser import new_context, screenshot, sign_in
from tests.test_endpoints_vllm import GpuWorld
from tests.test_finetune_system import MODEL
from tests.test_jobs_process import PRODUCT


@pytest.fixture
def gworld(tmp_path: Path) -> Iterator[GpuWorld]:
    w = GpuWorld(tmp_path, f"sqlite:///{tmp_path / 'sxwl.db'}")
    yield w
    w.close()


def test_a_model_is_deployed_and_chatted_with_in_the_playground(browser: Browser, gworld: GpuWorld) -> None:
    context = new_context(browser, gworld.url)
    page = context.new_page()
    try:
        sign_in(page, "dev@example.com", "correct horse")
        page.goto("/models")
        page.locator(f'li[data-model="{MODEL}"] a[href^="/endpoints?model="]').click()
        expect(page.locator("#f-model")).to_have_value(MODEL)
        page.locator("#f-name").fill("chat")
        page.locator("#f-gpus").fill("1")
        page.locator("#f-gpu_product").fill(PRODUCT)
        page.locator("#deploy-submit").click()
        row = page.locator('tr[data-endpoint="chat"]')
        expect(row).to_be_visible()
        for _ in range(60):
            if "就绪" in row.inner_text() and "1/1" in row.inner_text():
                break
            page.wait_for_timeout(1000)
            page.reload()
        expect(row).to_contain_text("就绪")
        row.locator('a[href$="/playground"]').click()
        expect(page).to_have_url(re.compile(r"/endpoints/ep-[0-9a-f]+/playground"))
        page.locator("#playground-input").fill("你好")
        page.locator("#playground-send").click()
        expect(page.locator(".chat-assistant").last).to_have_text("fake vllm says hi ")
        screenshot(page, "endpoint-playground")
        # A second turn carries the first (the stand-in answers each the same).
        page.locator("#playground-input").fill("again")
        page.locator("#playground-send").click()
        expect(page.locator(".chat-assistant")).to_have_count(2)
        expect(page.locator(".chat-assistant").last).to_have_text("fake vllm says hi ")
    finally:
        context.close()  # the world's close deletes the endpoint and waits for its replica
