"""The console in a real browser: Debian's Chromium, headless, against `sxwl serve` as a process.

Screenshots of every page go to test-artifacts/screenshots/ for people to look at.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, ViewportSize, expect

from tests.support.browser import (
    PASSWORD,
    api_access_key,
    api_register,
    api_token,
    create_admin,
    new_context,
    screenshot,
)
from tests.support.cloud import CloudProcess
from tests.support.net import free_port

pytestmark = pytest.mark.browser

MASKED_KEY = re.compile(r"^sxak_•+[A-Za-z0-9_-]{4}$")


@dataclass(frozen=True)
class Cloud:
    url: str
    data_dir: Path


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cloud]:
    data_dir = tmp_path_factory.mktemp("cloud") / "data"  # SQLite: the default database
    # Every test signs up from 127.0.0.1; the default of 10 sign-ups an hour per address is too few.
    limits = {"SXWL_RATE_REGISTER_IP": "100/3600", "SXWL_RATE_LOGIN_IP": "300/60"}
    process = CloudProcess(data_dir, free_port(), env=limits)
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


def register_in_browser(page: Page, tab: str, email: str, name: str, phone: str, company: str = "") -> None:
    page.goto("/register")
    page.get_by_role("tab", name=tab).click()
    expect(page.get_by_role("tab", name=tab)).to_have_attribute("aria-selected", "true")
    page.locator("#f-email").fill(email)
    page.locator("#f-password").fill(PASSWORD)
    page.locator("#f-name").fill(name)
    if company:
        page.locator("#f-company").fill(company)
    page.locator("#f-phone").fill(phone)


def submit_login(page: Page, email: str, password: str) -> None:
    page.locator("#f-email").fill(email)
    page.locator("#f-password").fill(password)
    page.get_by_role("button", name="登录", exact=True).click()


def sign_in(page: Page, email: str, password: str = PASSWORD) -> None:
    page.goto("/login")
    submit_login(page, email, password)
    expect(page).not_to_have_url(re.compile(r"/login"))


def test_provider_registers_reveals_copies_and_rotates_access_key(page: Page, cloud: Cloud) -> None:
    email = "provider@example.com"
    register_in_browser(
        page, "算力源注册", email, "李雷", "+86 138 0000 0000", company="闲置算力科技有限公司"
    )
    expect(page.locator("#f-company")).to_be_visible()
    expect(page.get_by_text("将闲置 GPU 服务器部署为 CPod")).to_be_visible()
    screenshot(page, "register")
    page.get_by_role("button", name="注册", exact=True).click()

    expect(page).to_have_url(re.compile(r"/account\?notice=registered$"))
    expect(page.get_by_role("status").filter(has_text="注册成功")).to_have_text("注册成功，欢迎使用算想云。")
    details = page.locator("#account-details")
    expect(details).to_contain_text(email)
    expect(details).to_contain_text("闲置算力科技有限公司")
    expect(details).to_contain_text("算力源")

    key_box = page.locator("#access-key")
    expect(key_box).to_have_attribute("data-masked", "true")
    expect(key_box).to_have_text(MASKED_KEY)
    masked = key_box.inner_text()
    screenshot(page, "account-masked")

    token = api_token(cloud.url, email)
    api_key = api_access_key(cloud.url, token)
    assert api_key.startswith("sxak_")
    assert masked.endswith(api_key[-4:])
    assert api_key not in page.content()  # the page itself never carries the key

    page.get_by_role("button", name="显示", exact=True).click()
    expect(key_box).to_have_attribute("data-masked", "false")
    expect(page.get_by_role("button", name="隐藏", exact=True)).to_be_visible()
    old_key = key_box.inner_text()
    assert old_key.startswith("sxak_")
    assert old_key == api_key
    screenshot(page, "account-revealed")

    copy = page.locator("#copy-key")
    copy.click()
    expect(copy).to_have_text("已复制")
    assert page.evaluate("navigator.clipboard.readText()") == old_key
    copy.click()  # a second click while it says 已复制 must not make that its label
    expect(copy).to_have_text("复制", timeout=5_000)

    page.get_by_role("button", name="隐藏", exact=True).click()
    expect(key_box).to_have_text(masked)

    page.get_by_role("button", name="重新生成", exact=True).click()
    dialog = page.locator("#rotate-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("旧的 accessKey 将立即失效")
    screenshot(page, "rotate-dialog", full_page=False)
    dialog.get_by_role("button", name="确认重新生成").click()

    expect(page).to_have_url(re.compile(r"/account\?rotated=1$"))
    expect(page.locator("#rotate-done")).to_be_visible()
    expect(page.locator("#rotate-done")).to_have_text("accessKey 已重新生成，旧的 accessKey 已失效。")
    rows = page.locator("#key-history tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("使用中")
    expect(rows.nth(1)).to_contain_text(f"…{old_key[-4:]}")
    expect(rows.nth(1)).to_contain_text(email)  # revoked by the provider themself

    page.get_by_role("button", name="显示", exact=True).click()
    expect(key_box).to_have_attribute("data-masked", "false")
    new_key = key_box.inner_text()
    assert new_key.startswith("sxak_")
    assert new_key != old_key
    assert api_access_key(cloud.url, token) == new_key
    assert api_access_key(cloud.url, token) != old_key
    expect(rows.nth(0)).to_contain_text(f"…{new_key[-4:]}")

    page.get_by_role("navigation", name="main").get_by_role("link", name="算力详情").click()
    expect(page).to_have_url(re.compile(r"/compute$"))
    expect(page.get_by_role("heading", name="还没有 CPod 上报算力")).to_be_visible()
    expect(page.get_by_text("部署 CPod 后，算力源相关信息将注册并上报至算想云")).to_be_visible()
    deploy = page.locator("#deploy-command")
    expect(deploy).to_contain_text(f"--access-key={new_key}")
    expect(deploy).to_contain_text(f"--cloud {cloud.url}")
    screenshot(page, "compute-empty")

    deploy.locator("xpath=..").get_by_role("button", name="复制").click()
    expect(deploy.locator("xpath=..").get_by_role("button")).to_have_text("已复制")
    copied = page.evaluate("navigator.clipboard.readText()")
    assert copied == f"sudo ./3kctl deploy all --access-key={new_key} --cloud {cloud.url}"


def test_logout_and_login_form_with_wrong_password(page: Page, cloud: Cloud) -> None:
    email = "login@example.com"
    api_register(cloud.url, email, "provider")

    page.goto("/login")
    submit_login(page, email, "wrong password")
    expect(page.get_by_role("alert")).to_have_text("邮箱或密码错误。")
    expect(page).to_have_url(re.compile(r"/login$"))
    expect(page.locator("#f-email")).to_have_value(email)  # kept, so only the password is retyped
    expect(page.locator("#f-password")).to_have_value("")
    screenshot(page, "login-error")

    page.locator("#f-password").fill(PASSWORD)
    page.get_by_role("button", name="登录", exact=True).click()
    expect(page).to_have_url(re.compile(r"/compute$"))  # a provider's start page
    expect(page.locator(".whoami")).to_contain_text(email)

    page.get_by_role("button", name="退出登录").click()
    expect(page).to_have_url(re.compile(r"/login\?notice=logged_out$"))
    expect(page.get_by_role("status")).to_have_text("您已退出登录。")

    page.goto("/account")
    expect(page).to_have_url(re.compile(r"/login\?next=/account$"))
    submit_login(page, email, PASSWORD)
    expect(page).to_have_url(re.compile(r"/account$"))
    expect(page.get_by_role("heading", name="账户", exact=True)).to_be_visible()


def test_switch_to_english(page: Page, cloud: Cloud) -> None:
    email = "english@example.com"
    api_register(cloud.url, email, "provider")
    sign_in(page, email)
    page.goto("/account")
    expect(page.locator("html")).to_have_attribute("lang", "zh-CN")

    page.get_by_role("link", name="English").click()
    expect(page).to_have_url(re.compile(r"/account$"))
    expect(page.locator("html")).to_have_attribute("lang", "en")
    expect(page.get_by_role("heading", name="Registration details")).to_be_visible()
    expect(page.get_by_role("button", name="Reveal", exact=True)).to_be_visible()
    expect(page.get_by_role("button", name="Rotate", exact=True)).to_be_visible()
    nav = page.get_by_role("navigation", name="main")
    expect(nav.get_by_role("link", name="Compute details")).to_be_visible()
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()
    expect(page.locator("#key-history thead")).to_contain_text("Created")
    screenshot(page, "account-english")

    dialog = page.locator("#rotate-dialog")
    page.get_by_role("button", name="Rotate", exact=True).click()
    expect(dialog).to_contain_text("Rotate the accessKey?")
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
    page.get_by_role("button", name="Rotate", exact=True).click()
    expect(dialog).to_be_visible()
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    page.reload()
    expect(page.locator("#key-history tbody tr")).to_have_count(1)  # cancel and Escape rotate nothing

    page.get_by_role("link", name="中文").click()
    expect(page.locator("html")).to_have_attribute("lang", "zh-CN")
    expect(page.get_by_role("heading", name="注册信息")).to_be_visible()


def test_failed_rotation_shows_error_and_escape_then_rotates_nothing(page: Page, cloud: Cloud) -> None:
    email = "flaky@example.com"
    api_register(cloud.url, email, "provider")
    sign_in(page, email)
    page.goto("/account")
    dialog = page.locator("#rotate-dialog")

    page.route(
        "**/api/v1/me/access-key/rotate",
        lambda route: route.fulfill(
            status=503, content_type="application/json", body='{"error": {"message": "try later"}}'
        ),
    )
    page.get_by_role("button", name="重新生成", exact=True).click()
    dialog.get_by_role("button", name="确认重新生成").click()
    expect(page.locator("#key-error")).to_have_text("try later")
    page.unroute("**/api/v1/me/access-key/rotate")

    with page.expect_request("**/api/v1/**") as nothing_else:  # the next call must be ours, not a rotation
        page.get_by_role("button", name="重新生成", exact=True).click()
        expect(dialog).to_be_visible()
        page.keyboard.press("Escape")
        expect(dialog).to_be_hidden()
        page.get_by_role("button", name="显示", exact=True).click()
    assert nothing_else.value.url.endswith("/api/v1/me/access-key")
    assert nothing_else.value.method == "GET"
    page.reload()
    expect(page.locator("#key-history tbody tr")).to_have_count(1)


def test_compute_user_has_no_compute_page(page: Page, cloud: Cloud) -> None:
    email = "user@example.com"
    register_in_browser(page, "算力用户注册", email, "韩梅梅", "13900000000")
    expect(page.locator("#f-company")).to_have_count(0)  # company is asked of providers only
    page.get_by_role("button", name="注册", exact=True).click()

    expect(page).to_have_url(re.compile(r"/account\?notice=registered$"))
    nav = page.get_by_role("navigation", name="main")
    expect(nav.get_by_role("link", name="账户")).to_be_visible()
    expect(nav.get_by_role("link", name="算力详情")).to_have_count(0)
    expect(nav.get_by_role("link", name="可用算力")).to_be_visible()
    expect(page.locator("#account-details")).to_contain_text("算力用户")
    expect(page.locator("#access-key-card")).to_have_count(0)

    response = page.goto("/compute")
    assert response is not None
    assert response.status == 403
    expect(page.get_by_role("heading", name="您没有权限访问此页面。")).to_be_visible()


def test_admin_sees_registered_users(page: Page, cloud: Cloud) -> None:
    provider, user, admin = "farm@example.com", "trainer@example.com", "admin@example.com"
    api_register(cloud.url, provider, "provider")
    api_register(cloud.url, user, "user")
    create_admin(cloud.data_dir, admin)

    page.goto("/login")
    submit_login(page, admin, PASSWORD)
    expect(page).to_have_url(re.compile(r"/admin/users$"))  # an admin's start page
    table = page.locator("#users")
    for email in (provider, user, admin):
        expect(table.get_by_role("row").filter(has_text=email)).to_have_count(1)
    expect(table.get_by_role("row").filter(has_text=provider)).to_contain_text("算力源")
    expect(table.get_by_role("row").filter(has_text=user)).to_contain_text("算力用户")
    total = table.locator("tbody tr").count()
    expect(page.get_by_text(f"共 {total} 个用户")).to_be_visible()
    nav = page.get_by_role("navigation", name="main")
    expect(nav.get_by_role("link", name="用户管理")).to_be_visible()
    expect(nav.get_by_role("link", name="算力详情")).to_be_visible()  # every CPod, with its owner
    screenshot(page, "admin-users")

    page.get_by_role("searchbox").fill("trainer")
    page.get_by_role("button", name="筛选").click()
    expect(page).to_have_url(re.compile(r"q=trainer"))
    expect(table.locator("tbody tr")).to_have_count(1)
    expect(table).to_contain_text(user)


@pytest.mark.parametrize("width", [390, 820])
def test_narrow_screens_do_not_overflow(browser: Browser, cloud: Cloud, width: int) -> None:
    email = f"narrow-{width}-with-a-rather-long-address@example.com"
    api_register(cloud.url, email, "provider")
    context = new_context(browser, cloud.url, viewport=ViewportSize(width=width, height=800))
    try:
        page = context.new_page()
        sign_in(page, email)
        for path in ("/account", "/compute"):
            page.goto(path)
            assert page.evaluate("document.documentElement.scrollWidth") <= width, path
            # Navigation labels and the brand stay on one line (they once wrapped a character a line).
            for label in (page.locator(".brand-name"), *page.locator(".nav a").all()):
                box = label.bounding_box()
                assert box is not None
                assert box["height"] < 40, (path, label.inner_text(), box)
            screenshot(page, f"{path.strip('/')}-{width}px")
    finally:
        context.close()
