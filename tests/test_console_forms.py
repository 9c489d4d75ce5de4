"""Console pages over HTTP: CSRF, cookies, role navigation, errors in place, language switch."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from tests.conftest import register


def csrf(client: TestClient, path: str) -> str:
    page = client.get(path)
    assert page.status_code == 200
    match = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert match, page.text
    return match.group(1)


def register_form(client: TestClient, role: str = "provider", email: str = "owner@example.com") -> None:
    token = csrf(client, f"/register?role={role}")
    response = client.post(
        "/register",
        data={
            "csrf_token": token,
            "role": role,
            "email": email,
            "password": "correct horse",
            "company": "GPU Farm",
        },
        follow_redirects=False,
    )
    assert response.status_code == 303, response.text
    assert response.headers["location"] == "/account?notice=registered"


def test_register_through_the_form_signs_in_with_a_safe_cookie(client: TestClient) -> None:
    register_form(client)
    cookie = next(c for c in client.cookies.jar if c.name == "sxwl_session")
    assert cookie.has_nonstandard_attr("HttpOnly")
    account = client.get("/account")
    assert account.status_code == 200
    assert "owner@example.com" in account.text and "GPU Farm" in account.text
    assert "sxak_" in account.text  # masked key with its hint; the full key is fetched on reveal
    assert account.headers["cache-control"] == "no-store"
    assert "frame-ancestors 'none'" in account.headers["content-security-policy"]


def test_session_cookie_attributes(client: TestClient) -> None:
    token = csrf(client, "/register?role=user")
    response = client.post(
        "/register",
        data={"csrf_token": token, "role": "user", "email": "dev@example.com", "password": "correct horse"},
        follow_redirects=False,
    )
    cookies = response.headers.get_list("set-cookie")
    set_cookie = next(v for v in cookies if v.startswith("sxwl_session="))
    assert "HttpOnly" in set_cookie
    assert "samesite=lax" in set_cookie.lower()
    assert "Path=/" in set_cookie


def test_form_posts_without_csrf_are_refused_and_change_nothing(client: TestClient) -> None:
    client.get("/register")
    response = client.post(
        "/register",
        data={
            "csrf_token": "forged",
            "role": "provider",
            "email": "x@example.com",
            "password": "correct horse",
        },
    )
    assert response.status_code == 403
    login = client.post("/api/v1/auth/login", json={"email": "x@example.com", "password": "correct horse"})
    assert login.status_code == 401


def test_cookie_api_calls_need_the_csrf_header(client: TestClient) -> None:
    register_form(client)
    assert client.get("/api/v1/me/access-key").status_code == 200  # reads need no token
    refused = client.post("/api/v1/me/access-key/rotate")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "csrf"
    token = client.cookies.get("sxwl_csrf")
    assert token
    assert client.post("/api/v1/me/access-key/rotate", headers={"X-CSRF-Token": token}).status_code == 200


def test_form_errors_are_shown_in_place(client: TestClient) -> None:
    register(client, "taken@example.com")
    token = csrf(client, "/register")
    bad = client.post(
        "/register", data={"csrf_token": token, "role": "provider", "email": "nope", "password": "x"}
    )
    assert bad.status_code == 422
    assert "请输入有效的邮箱地址" in bad.text and "密码至少 8 个字符" in bad.text
    assert 'value="nope"' in bad.text  # what the user typed is kept (never the password)
    dup = client.post(
        "/register",
        data={"csrf_token": token, "role": "user", "email": "TAKEN@example.com", "password": "correct horse"},
    )
    assert dup.status_code == 409 and "该邮箱已注册" in dup.text
    wrong = client.post(
        "/login", data={"csrf_token": token, "email": "taken@example.com", "password": "bad one!"}
    )
    assert wrong.status_code == 401 and "邮箱或密码错误" in wrong.text


def test_navigation_fits_the_role(client: TestClient) -> None:
    register_form(client, "provider", "owner@example.com")
    assert 'href="/compute"' in client.get("/account").text
    assert client.get("/", follow_redirects=False).headers["location"] == "/compute"

    other = TestClient(client.app)
    register_form(other, "user", "dev@example.com")
    page = other.get("/account").text
    assert 'href="/compute"' not in page and 'href="/admin/users"' not in page
    assert other.get("/compute").status_code == 403
    assert other.get("/admin/users").status_code == 403


def test_compute_page_fills_in_key_and_cloud_url(client: TestClient) -> None:
    register_form(client)
    key = client.get("/api/v1/me/access-key").json()["access_key"]
    page = client.get("/compute")
    assert "还没有 CPod 上报算力" in page.text
    assert f"sudo ./3kctl deploy all --access-key={key} --cloud http://testserver" in page.text


def test_pages_need_a_sign_in(client: TestClient) -> None:
    for path in ("/account", "/compute", "/admin/users"):
        response = client.get(path, follow_redirects=False)
        assert response.status_code == 303
        assert response.headers["location"] == f"/login?next={path}"


def test_open_redirects_are_ignored(client: TestClient) -> None:
    register(client, "owner@example.com")
    token = csrf(client, "/login")
    response = client.post(
        "/login",
        data={
            "csrf_token": token,
            "email": "owner@example.com",
            "password": "correct horse",
            "next": "//evil.example.com/",
        },
        follow_redirects=False,
    )
    assert response.headers["location"] == "/compute"


def test_language_switch(client: TestClient) -> None:
    assert "登录算想云" in client.get("/login").text
    client.get("/lang/en?next=/login")
    english = client.get("/login").text
    assert "Sign in to SXWL Cloud" in english and 'lang="en"' in english


def test_logout_revokes_the_session(client: TestClient) -> None:
    register_form(client)
    token = csrf(client, "/account")
    session_cookie = client.cookies.get("sxwl_session")
    client.post("/logout", data={"csrf_token": token})
    assert client.get("/account", follow_redirects=False).status_code == 303
    # The old cookie value is dead on the server, not only forgotten by the browser.
    replay = TestClient(client.app, cookies={"sxwl_session": session_cookie or ""})
    assert replay.get("/api/v1/me").status_code == 401


def test_html_404_for_browsers_json_for_api(client: TestClient) -> None:
    page = client.get("/no-such-page", headers={"accept": "text/html"})
    assert page.status_code == 404 and "页面不存在" in page.text
    api = client.get("/api/v1/no-such", headers={"accept": "text/html"})
    assert api.status_code == 404 and api.json()["error"]["code"] == "not_found"
