"""Headless Chromium (Debian's, through Playwright) against a cloud process, plus API shortcuts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, ViewportSize

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
REPO_ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO_ROOT / "test-artifacts" / "screenshots"
PASSWORD = "correct horse battery"


def launch(playwright: Playwright) -> Browser:
    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"{CHROMIUM} is missing: run `make test-deps` (Debian's chromium)")
    browser: Browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
    return browser


def new_context(
    browser: Browser, origin: str, viewport: ViewportSize | None = None, locale: str = "zh-CN"
) -> BrowserContext:
    context: BrowserContext = browser.new_context(
        viewport=viewport or ViewportSize(width=1280, height=800), locale=locale, base_url=origin
    )
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=origin)
    context.set_default_timeout(10_000)
    return context


def screenshot(page: Page, name: str, full_page: bool = True) -> Path:
    """A PNG under test-artifacts/screenshots/ (gitignored), for people to look at.

    A modal dialog is better taken as the viewport: in a full-page capture its backdrop, which is fixed
    to the viewport, stops at the first screen's height and looks like a layout bug."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def api_token(cloud_url: str, email: str, password: str = PASSWORD) -> str:
    response = httpx.post(
        f"{cloud_url}/api/v1/auth/login", json={"email": email, "password": password}, timeout=10
    )
    assert response.status_code == 200, response.text
    token: str = response.json()["access_token"]
    return token


def api_access_key(cloud_url: str, token: str) -> str:
    response = httpx.get(
        f"{cloud_url}/api/v1/me/access-key", headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    assert response.status_code == 200, response.text
    key: str = response.json()["access_key"]
    return key


def api_register(cloud_url: str, email: str, role: str, password: str = PASSWORD) -> None:
    response = httpx.post(
        f"{cloud_url}/api/v1/auth/register",
        json={"email": email, "password": password, "role": role},
        timeout=10,
    )
    assert response.status_code == 201, response.text


def create_admin(data_dir: Path, email: str, password: str = PASSWORD) -> None:
    """The documented way to make the first admin: the CLI on the server's data dir."""
    env = {**os.environ, "SXWL_ARGON2_TIME_COST": "1", "SXWL_ARGON2_MEMORY_KIB": "1024"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sxwl.cli",
            "admin",
            "create-user",
            "--email",
            email,
            "--role",
            "admin",
            "--password-stdin",
            "--data-dir",
            str(data_dir),
        ],
        input=password + "\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
