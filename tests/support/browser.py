"""Headless Chromium (Debian's, through Playwright) against a cloud process, plus API shortcuts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, ViewportSize, expect

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
    to the viewport, stops at the first screen's height and looks like a layout bug. A full page is
    taken from the top: scrolled, the sticky top bar would be drawn in the middle of the capture."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    if full_page:
        page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(path), full_page=full_page)
    return path


def submit_login(page: Page, email: str, password: str) -> None:
    page.locator("#f-email").fill(email)
    page.locator("#f-password").fill(password)
    page.locator("form[action='/login'] button[type=submit]").click()


def sign_in(page: Page, email: str, password: str = PASSWORD) -> None:
    page.goto("/login")
    submit_login(page, email, password)
    expect(page).not_to_have_url(re.compile(r"/login"))


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


# ---- CPods straight through the agent API (what sxwl-agent does), for pages that show them ----

A100_80GB = {"vendor": "nvidia", "product": "NVIDIA-A100-SXM4-80GB", "memory_mib": 81920}


def gpu_node(name: str, count: int = 8, used: int = 0, status: str = "ready") -> dict[str, Any]:
    return {
        "name": name,
        "status": status,
        "cpu_cores": 96,
        "memory_mib": 1024 * 1024,
        "gpu": {**A100_80GB, "count": count, "allocatable": count, "used": used},
    }


def api_register_cpod(
    cloud_url: str, access_key: str, cluster_uid: str, name: str, heartbeat_interval_s: float = 0.5
) -> tuple[str, str]:
    """Registers a CPod as its agent would: (cpod_id, cpod_token)."""
    response = httpx.post(
        f"{cloud_url}/api/v1/agent/register",
        headers={"Authorization": f"Bearer {access_key}"},
        json={
            "cluster_uid": cluster_uid,
            "name": name,
            "runtime": "local",
            "agent_version": "t",
            "heartbeat_interval_s": heartbeat_interval_s,
        },
        timeout=10,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    return body["cpod_id"], body["cpod_token"]


def api_heartbeat(cloud_url: str, cpod_token: str, seq: int, nodes: list[dict[str, Any]]) -> int:
    response = httpx.post(
        f"{cloud_url}/api/v1/agent/heartbeat",
        headers={"Authorization": f"Bearer {cpod_token}"},
        json={"seq": seq, "nodes": nodes},
        timeout=10,
    )
    return response.status_code


class Heartbeats:
    """Heartbeats for one CPod from a background thread until ``stop()``, like a running agent.

    The first heartbeat is sent before ``__init__`` returns, so the CPod is online from then on."""

    def __init__(
        self, cloud_url: str, cpod_token: str, nodes: list[dict[str, Any]], every_s: float = 0.2
    ) -> None:
        self.cloud_url, self.token, self.nodes, self.every_s = cloud_url, cpod_token, nodes, every_s
        self.seq = 0
        self.refused: list[int] = []
        self._stop = threading.Event()
        self._beat()
        assert not self.refused, self.refused
        self._thread = threading.Thread(target=self._run, name=f"heartbeats-{cpod_token[-4:]}", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        self.seq += 1
        try:
            status = api_heartbeat(self.cloud_url, self.token, self.seq, self.nodes)
        except httpx.HTTPError:
            return  # a slow moment of the server: the next beat tries again
        if status != 200:
            self.refused.append(status)
            self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._beat()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        assert not self._thread.is_alive()


def api_cpods(cloud_url: str, token: str) -> list[dict[str, Any]]:
    response = httpx.get(
        f"{cloud_url}/api/v1/cpods", headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    assert response.status_code == 200, response.text
    cpods: list[dict[str, Any]] = response.json()
    return cpods


def register_in_form(page: Page, role: str, email: str, password: str = PASSWORD) -> None:
    """Signs up through the console's form (role ``user`` or ``provider``); signed in afterwards."""
    page.goto(f"/register?role={role}")
    page.locator("#f-email").fill(email)
    page.locator("#f-password").fill(password)
    page.locator("form[action='/register'] button[type=submit]").click()
    expect(page).to_have_url(re.compile(r"/account\?notice=registered$"))


def fits_width(page: Page, width: int) -> bool:
    """Nothing makes the page scroll sideways at this viewport width."""
    scroll_width: int = page.evaluate("document.documentElement.scrollWidth")
    return scroll_width <= width
