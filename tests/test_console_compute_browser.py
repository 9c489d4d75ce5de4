"""算力详情 in a real browser against `sxwl serve` as a process, with CPods heartbeating from this test.

The cloud runs with a short liveness loop and no offline grace, so a CPod whose heartbeats stop is
offline about two seconds later, and the page (refreshing its live part every 5 s) shows it without
a reload. Screenshots go to test-artifacts/screenshots/.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Locator, Page, ViewportSize, expect

from tests.support.browser import (
    Heartbeats,
    api_access_key,
    api_heartbeat,
    api_register,
    api_register_cpod,
    api_token,
    create_admin,
    fits_width,
    gpu_node,
    new_context,
    screenshot,
    sign_in,
)
from tests.support.cloud import CloudProcess
from tests.support.net import free_port

pytestmark = pytest.mark.browser

A100 = "NVIDIA-A100-SXM4-80GB"
# One refresh is 5 s; the offline flip needs the liveness loop (about 2 s) and then the next refresh.
LIVE_TIMEOUT_MS = 20_000


@dataclass(frozen=True)
class Cloud:
    url: str
    data_dir: Path


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cloud]:
    data_dir = tmp_path_factory.mktemp("cloud") / "data"
    env = {
        "SXWL_OFFLINE_GRACE_S": "0",
        "SXWL_LIVENESS_CHECK_S": "0.2",
        "SXWL_HEARTBEAT_INTERVAL_MIN_S": "0.2",
        "SXWL_RATE_REGISTER_IP": "100/3600",
        "SXWL_RATE_LOGIN_IP": "300/60",
    }
    process = CloudProcess(data_dir, free_port(), env=env)
    try:
        yield Cloud(process.url, data_dir)
    finally:
        process.stop()


@pytest.fixture
def page(browser: Browser, cloud: Cloud) -> Iterator[Page]:
    context = new_context(browser, cloud.url)
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.fixture
def beats() -> Iterator[list[Heartbeats]]:
    """Heartbeat threads a test starts; all stopped at its end, whatever happened."""
    started: list[Heartbeats] = []
    yield started
    for running in started:
        running.stop()


def provider_key(cloud: Cloud, email: str) -> str:
    api_register(cloud.url, email, "provider")
    return api_access_key(cloud.url, api_token(cloud.url, email))


def cpod_card(page: Page, cpod_id: str) -> Locator:
    return page.locator(f"#cpod-{cpod_id}")


def status_badge(page: Page, cpod_id: str) -> Locator:
    return cpod_card(page, cpod_id).locator(".cpod-status")


def total_of(page: Page, field: str) -> Locator:
    return page.locator(f'#gpu-totals [data-product="{A100}"] [data-field="{field}"]')


def test_live_compute_details_rename_and_revoke(page: Page, cloud: Cloud, beats: list[Heartbeats]) -> None:
    email = "farm@example.com"
    key = provider_key(cloud, email)
    steady_id, steady_token = api_register_cpod(cloud.url, key, "cluster-steady-0001", "beijing-a100")
    fading_id, fading_token = api_register_cpod(cloud.url, key, "cluster-fading-0002", "shanghai-a100")
    steady_nodes = [gpu_node("bj-gpu-01", used=3), gpu_node("bj-gpu-02", used=1)]
    fading_nodes = [gpu_node("sh-gpu-01", used=2), gpu_node("sh-gpu-02", status="not_ready")]
    beats.append(Heartbeats(cloud.url, steady_token, steady_nodes))
    fading = Heartbeats(cloud.url, fading_token, fading_nodes)
    beats.append(fading)

    sign_in(page, email)
    expect(page).to_have_url(re.compile(r"/compute$"))
    expect(status_badge(page, steady_id)).to_have_attribute("data-status", "online")
    expect(status_badge(page, fading_id)).to_have_attribute("data-status", "online")
    expect(status_badge(page, steady_id)).to_have_text("在线")
    # Both online: 4 nodes × 8, the not-ready node has nothing allocatable, 3 + 1 + 2 in use.
    expect(total_of(page, "total")).to_have_text("32")
    expect(total_of(page, "allocatable")).to_have_text("24")
    expect(total_of(page, "available")).to_have_text("18")
    steady = cpod_card(page, steady_id)
    expect(steady.locator("table.nodes tbody tr")).to_have_count(2)
    first_row = steady.locator("table.nodes tbody tr").first
    expect(first_row.locator("td")).to_have_text(
        ["bj-gpu-01", "就绪", A100, "80 GiB", "8", "8", "3", "96", "1024"]
    )
    expect(steady.locator(".ago")).to_have_text(re.compile(r"^\d+ 秒前$"))
    expect(page.get_by_text("部署新的 CPod")).to_be_visible()
    expect(page.locator("#deploy-command")).to_be_hidden()  # collapsed while there are CPods

    # Things a refresh must leave alone: an open <details> and a name being typed.
    page.evaluate("window.__sameDocument = true")
    events = page.locator(f"#events-{fading_id}")
    events.locator("summary").click()
    expect(events).to_have_attribute("open", "")
    name_input = page.locator(f"#rename-{steady_id}")
    name_input.fill("being typed")

    fading.stop()  # its agent goes away
    expect(status_badge(page, fading_id)).to_have_attribute("data-status", "offline", timeout=LIVE_TIMEOUT_MS)
    expect(status_badge(page, fading_id)).to_have_text("离线")
    expect(events.locator("tr[data-kind=offline]")).to_have_count(1)
    expect(events.locator("tr[data-kind=offline] .badge")).to_have_text("离线")
    expect(total_of(page, "total")).to_have_text("16")  # only online CPods count
    expect(total_of(page, "available")).to_have_text("12")
    expect(status_badge(page, steady_id)).to_have_attribute("data-status", "online")
    assert page.evaluate("window.__sameDocument") is True  # no reload happened
    expect(events).to_have_attribute("open", "")
    expect(name_input).to_have_value("being typed")
    heard = cpod_card(page, fading_id).locator(".ago")
    expect(heard).to_have_text(re.compile(r"^\d+ 秒前$"))
    last_seen = heard.inner_text()
    expect(heard).not_to_have_text(last_seen)  # "N 秒前" keeps counting
    screenshot(page, "compute-cpods")

    # Rename: an empty name is refused in place, then a good one is taken.
    name_input.fill("")
    steady.get_by_role("button", name="重命名").click()
    steady = cpod_card(page, steady_id)
    expect(steady.locator(".field-error")).to_have_text("此项为必填项。")
    expect(page.locator(".field-error")).to_have_count(1)
    name_input = page.locator(f"#rename-{steady_id}")
    expect(name_input).to_have_attribute("aria-invalid", "true")
    name_input.fill("北京一号")
    steady.get_by_role("button", name="重命名").click()
    expect(page).to_have_url(re.compile(rf"/compute\?notice=cpod_renamed#cpod-{steady_id}$"))
    expect(page.get_by_role("status")).to_have_text("CPod 已重命名。")
    expect(cpod_card(page, steady_id).locator(".cpod-name")).to_have_text("北京一号")
    expect(cpod_card(page, steady_id).locator(f"#events-{steady_id} tr[data-kind=renamed]")).to_contain_text(
        "beijing-a100 → 北京一号"
    )

    # Revoke: Cancel and Escape do nothing; confirming revokes.
    fading_card = cpod_card(page, fading_id)
    dialog = page.locator(f"#revoke-{fading_id}")
    fading_card.get_by_role("button", name="吊销", exact=True).click()
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("吊销 CPod「shanghai-a100」？")
    screenshot(page, "compute-revoke-dialog", full_page=False)
    dialog.get_by_role("button", name="取消").click()
    expect(dialog).to_be_hidden()
    fading_card.get_by_role("button", name="吊销", exact=True).click()
    expect(dialog).to_be_visible()
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    expect(status_badge(page, fading_id)).to_have_attribute("data-status", "offline")
    fading_card.get_by_role("button", name="吊销", exact=True).click()
    dialog.get_by_role("button", name="确认吊销").click()
    expect(page).to_have_url(re.compile(rf"/compute\?notice=cpod_revoked#cpod-{fading_id}$"))
    expect(status_badge(page, fading_id)).to_have_attribute("data-status", "revoked")
    expect(status_badge(page, fading_id)).to_have_text("已吊销")
    expect(cpod_card(page, fading_id).get_by_role("button", name="吊销", exact=True)).to_have_count(0)
    expect(cpod_card(page, fading_id).locator(f"#events-{fading_id} tr[data-kind=revoked]")).to_contain_text(
        email
    )
    assert api_heartbeat(cloud.url, fading_token, 1000, fading_nodes) == 401  # its token is dead
    expect(status_badge(page, steady_id)).to_have_attribute("data-status", "online")


def test_english_narrow_admin_and_user_pages(browser: Browser, cloud: Cloud, beats: list[Heartbeats]) -> None:
    email = "lab@example.com"
    key = provider_key(cloud, email)
    online_id, online_token = api_register_cpod(cloud.url, key, "cluster-lab-online-01", "lab-a100-cluster")
    offline_id, offline_token = api_register_cpod(cloud.url, key, "cluster-lab-offline-1", "lab-spare")
    nodes = [gpu_node(f"lab-gpu-{i:02d}", used=i % 3) for i in range(1, 4)]
    beats.append(Heartbeats(cloud.url, online_token, nodes))
    # One heartbeat, then silence: offline within about two seconds.
    assert api_heartbeat(cloud.url, offline_token, 1, [gpu_node("spare-01")]) == 200

    context = new_context(browser, cloud.url, locale="en-US")
    try:
        page = context.new_page()
        sign_in(page, email)
        page.goto("/lang/en?next=/compute")
        expect(page.locator("html")).to_have_attribute("lang", "en")
        expect(status_badge(page, offline_id)).to_have_text("Offline", timeout=LIVE_TIMEOUT_MS)
        expect(status_badge(page, online_id)).to_have_text("Online")
        expect(cpod_card(page, online_id).locator(".ago")).to_have_text(re.compile(r"^\d+ s ago$"))
        expect(page.get_by_role("heading", name="Compute details")).to_be_visible()
        expect(page.get_by_text("Deploy another CPod")).to_be_visible()
        page.locator(f"#events-{offline_id} summary").click()
        expect(page.locator(f"#events-{offline_id} tr[data-kind=registered] .badge")).to_have_text(
            "Registered"
        )
        screenshot(page, "compute-cpods-en")
    finally:
        context.close()

    context = new_context(browser, cloud.url, viewport=ViewportSize(width=390, height=844))
    try:
        page = context.new_page()
        sign_in(page, email)
        expect(status_badge(page, online_id)).to_have_text("在线")
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        # The node table scrolls inside its card instead of widening the page.
        wrap = cpod_card(page, online_id).locator(".cpod-nodes .table-wrap")
        assert wrap.evaluate("el => el.scrollWidth > el.clientWidth")
        box = wrap.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390
        screenshot(page, "compute-cpods-390px")
    finally:
        context.close()

    admin = "ops@example.com"
    create_admin(cloud.data_dir, admin)
    context = new_context(browser, cloud.url)
    try:
        page = context.new_page()
        sign_in(page, admin)
        page.get_by_role("navigation", name="main").get_by_role("link", name="算力详情").click()
        expect(page).to_have_url(re.compile(r"/compute$"))
        expect(cpod_card(page, online_id).locator(".cpod-owner")).to_have_text(email)
        expect(page.locator("#deploy-command")).to_have_count(0)
        screenshot(page, "compute-admin")
        # In English too (longer links): the owner's address whole on one line, and the admin's own
        # address in the header not cut short (issue 26, point 12).
        page.goto("/lang/en?next=/compute")
        owner = cpod_card(page, online_id).locator(".cpod-owner")
        expect(owner).to_have_text(email)
        one_line = "e => e.getBoundingClientRect().height < 1.5 * parseFloat(getComputedStyle(e).lineHeight)"
        assert owner.evaluate(one_line) and owner.evaluate("el => el.scrollWidth <= el.clientWidth")
        whoami = page.locator(".whoami-email")
        expect(whoami).to_have_text(admin)
        assert whoami.evaluate("el => el.scrollWidth <= el.clientWidth"), "the header cuts the address"
        assert fits_width(page, 1280)
        screenshot(page, "compute-admin-en")
        page.set_viewport_size({"width": 390, "height": 844})
        assert fits_width(page, 390)
        screenshot(page, "compute-admin-en-390px")
    finally:
        context.close()

    user = "trainer@example.com"
    api_register(cloud.url, user, "user")
    context = new_context(browser, cloud.url)
    try:
        page = context.new_page()
        sign_in(page, user)
        page.get_by_role("navigation", name="main").get_by_role("link", name="可用算力").click()
        expect(page).to_have_url(re.compile(r"/gpus$"))
        expect(page.get_by_role("heading", name="可用算力")).to_be_visible()
        card = page.locator(f'#gpu-types [data-product="{A100}"]')
        expect(card).to_be_visible()
        expect(card).to_contain_text("80 GiB")
        # The online CPods of every provider (the first test's CPods have stopped by now).
        expect(card.locator("[data-field=total]")).to_have_text("24", timeout=LIVE_TIMEOUT_MS)
        expect(page.get_by_text("lab-a100-cluster")).to_have_count(0)
        screenshot(page, "gpus-user")
        response = page.goto("/compute")
        assert response is not None and response.status == 403
    finally:
        context.close()


def test_first_cpod_replaces_the_empty_state_by_itself(
    page: Page, cloud: Cloud, beats: list[Heartbeats]
) -> None:
    email = "newcomer@example.com"
    key = provider_key(cloud, email)
    sign_in(page, email)
    expect(page.get_by_role("heading", name="还没有 CPod 上报算力")).to_be_visible()
    expect(page.locator("#deploy-command")).to_be_visible()

    cpod_id, token = api_register_cpod(cloud.url, key, "cluster-newcomer-01", "first-cpod")
    beats.append(Heartbeats(cloud.url, token, [gpu_node("n-01", count=4)]))
    # The page sees the CPod at its next refresh and reloads, since the deploy steps fold away too.
    expect(status_badge(page, cpod_id)).to_have_attribute("data-status", "online", timeout=LIVE_TIMEOUT_MS)
    expect(page.get_by_role("heading", name="还没有 CPod 上报算力")).to_have_count(0)
    expect(total_of(page, "total")).to_have_text("4")
    deploy = page.locator("#deploy-command")
    expect(deploy).to_be_hidden()
    page.get_by_text("部署新的 CPod").click()
    expect(deploy).to_be_visible()
    expect(deploy).to_contain_text(f"--access-key={key}")
