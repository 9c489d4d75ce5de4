"""The download and deploy commands on 算力详情's empty state and the account page, in Chromium at a
desktop and a phone width (docs/artifact.md, "Serving"): they name this cloud's URL, copy whole, and
do not widen the page."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ViewportSize, expect

from sxwl.artifactbuild.pack import tar_gz
from tests.ctl.conftest import make_artifact
from tests.support.browser import (
    api_access_key,
    api_register,
    api_token,
    fits_width,
    new_context,
    screenshot,
    sign_in,
)
from tests.support.cloud import CloudProcess
from tests.support.net import free_port


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudProcess]:
    work = tmp_path_factory.mktemp("served")
    built = work / "3k-artifact.tgz"
    tar_gz(make_artifact(work / "src" / "artifact"), built, "artifact")
    process = CloudProcess(work / "cloud", free_port(), env={"SXWL_ARTIFACT_FILE": str(built)})
    yield process
    process.stop()


@pytest.mark.parametrize(("width", "locale"), [(1280, "zh-CN"), (390, "en")])
def test_the_commands_name_this_cloud_at_desktop_and_phone_widths(
    browser: Browser, cloud: CloudProcess, width: int, locale: str, tmp_path: Path
) -> None:
    email = f"provider-{width}@example.com"
    api_register(cloud.url, email, "provider")
    key = api_access_key(cloud.url, api_token(cloud.url, email))
    context = new_context(browser, cloud.url, ViewportSize(width=width, height=800), locale=locale)
    page = context.new_page()
    try:
        sign_in(page, email)
        if locale == "en":
            page.context.add_cookies([{"name": "sxwl_lang", "value": "en", "url": cloud.url}])
        page.goto("/compute")
        download = page.locator("#download-command")
        expect(download).to_contain_text(f"wget {cloud.url}/downloads/3k-artifact.tgz")
        expect(page.locator("#deploy-command")).to_have_text(f"sudo ./3kctl deploy all --access-key={key}")
        assert fits_width(page, width)
        screenshot(page, f"artifact-compute-{width}")
        download.locator("xpath=..").locator(".copy-code").click()
        copied = page.evaluate("navigator.clipboard.readText()")
        assert copied.splitlines()[1] == f"wget {cloud.url}/downloads/3k-artifact.tgz"
        page.goto("/account")
        command = page.locator("#account-deploy-command")
        expect(command).to_contain_text(f"wget {cloud.url}/downloads/3k-artifact.tgz")
        expect(command).to_contain_text("sudo ./3kctl deploy all --access-key=<accessKey>")
        assert fits_width(page, width)
        screenshot(page, f"artifact-account-{width}")
    finally:
        context.close()
