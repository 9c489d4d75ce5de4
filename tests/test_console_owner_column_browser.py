"""An administrator's job list in a real browser: the owner column of a long address wraps before
its "@" (the console's ``email`` filter puts a ``<wbr>`` there), never at any letter, at desktop and
phone widths. Screenshots go to test-artifacts/screenshots/."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, Locator, ViewportSize

from tests.support.browser import api_register, api_token, create_admin, new_context, screenshot, sign_in
from tests.support.cloud import CloudProcess
from tests.support.net import free_port

pytestmark = pytest.mark.browser

LONG = "zhang.wei.research.team@computing-lab.example.org"
ADMIN = "ops@example.com"
# Each visual line of a cell's text: characters grouped by the top of their box.
LINES_JS = """cell => {
  const lines = new Map();
  const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (let i = 0; i < node.length; i++) {
      const range = document.createRange();
      range.setStart(node, i);
      range.setEnd(node, i + 1);
      const box = range.getBoundingClientRect();
      if (box.width === 0) continue;
      const top = Math.round(box.top);
      lines.set(top, (lines.get(top) || "") + node.data[i]);
    }
  }
  return [...lines.entries()].sort((a, b) => a[0] - b[0]).map(entry => entry[1]);
}"""


@pytest.fixture(scope="module")
def cloud_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir = tmp_path_factory.mktemp("cloud") / "data"
    process = CloudProcess(data_dir, free_port(), env={"SXWL_RATE_LOGIN_IP": "300/60"})
    try:
        api_register(process.url, LONG, "user")
        token = api_token(process.url, LONG)
        httpx.post(
            f"{process.url}/api/v1/jobs",
            headers={"Authorization": f"Bearer {token}"},
            json={"name": "long-owner", "command": "true"},
        ).raise_for_status()
        create_admin(data_dir, ADMIN)
        yield process.url
    finally:
        process.stop()


def lines(cell: Locator) -> list[str]:
    found: list[str] = cell.evaluate(LINES_JS)
    return found


@pytest.mark.parametrize(("width", "name"), [(1280, "desktop"), (390, "phone")])
def test_a_long_owner_address_wraps_only_before_its_at(
    browser: Browser, cloud_url: str, width: int, name: str
) -> None:
    context = new_context(browser, cloud_url)
    try:
        page = context.new_page()
        page.set_viewport_size(ViewportSize(width=width, height=800))
        sign_in(page, ADMIN)
        page.goto(f"{cloud_url}/jobs?all=1")
        cell = page.locator("td.job-owner").first
        seen = lines(cell)
        screenshot(page, f"jobs-admin-owner-{name}")
        local, domain = LONG.split("@")
        # Whole, or in two at the "@": neither at a letter nor at the domain's hyphen.
        assert seen in ([LONG], [local, f"@{domain}"]), seen
    finally:
        context.close()
