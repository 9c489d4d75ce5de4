"""算力详情 and 可用算力 over HTTP: CPods as their provider and admins see them, rename and revoke
through the console's forms (CSRF, errors in place, other providers refused), and users' GPU list."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import Role
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.accounts import accounts
from sxwl.cloud.services.fleet.cpods import counted, sweep_liveness
from sxwl.cloud.web.compute.view import ago, event_detail, gib
from sxwl.protocol.reasons import Reason
from tests.test_console_forms import csrf, register_form

A100 = {"vendor": "nvidia", "product": "NVIDIA-A100-SXM4-80GB", "memory_mib": 81920}
FAR_FUTURE = timedelta(days=3650)


def gpu_node(name: str, used: int = 2, status: str = "ready") -> dict[str, Any]:
    return {
        "name": name,
        "status": status,
        "cpu_cores": 96,
        "memory_mib": 512 * 1024,
        "gpu": {**A100, "count": 8, "allocatable": 8, "used": used},
    }


def cpu_node(name: str) -> dict[str, Any]:
    return {"name": name, "status": "ready", "cpu_cores": 16, "memory_mib": 65536}


def ctx_of(client: TestClient) -> CloudContext:
    ctx: CloudContext = client.app.state.ctx  # type: ignore[attr-defined]
    return ctx


def signed_in_provider(client: TestClient, email: str) -> TestClient:
    """A new browser-like client (own cookies) signed up as a provider through the form."""
    browser = TestClient(client.app)
    register_form(browser, "provider", email)
    return browser


def access_key(browser: TestClient) -> str:
    response = browser.get("/api/v1/me/access-key")
    assert response.status_code == 200, response.text
    key: str = response.json()["access_key"]
    return key


def register_cpod(client: TestClient, key: str, cluster_uid: str, **extra: Any) -> tuple[str, str]:
    """The agent's registration, straight against the API: (cpod_id, cpod_token)."""
    response = client.post(
        "/api/v1/agent/register",
        headers={"Authorization": f"Bearer {key}"},
        json={"cluster_uid": cluster_uid, "runtime": "local", "agent_version": "t", **extra},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    return body["cpod_id"], body["cpod_token"]


def beat(client: TestClient, token: str, seq: int, nodes: list[dict[str, Any]], **extra: Any) -> int:
    response = client.post(
        "/api/v1/agent/heartbeat",
        headers={"Authorization": f"Bearer {token}"},
        json={"seq": seq, "nodes": nodes, **extra},
    )
    status: int = response.status_code
    return status


def form_login(client: TestClient, email: str, password: str) -> TestClient:
    browser = TestClient(client.app)
    token = csrf(browser, "/login")
    response = browser.post(
        "/login",
        data={"csrf_token": token, "email": email, "password": password},
        follow_redirects=False,
    )
    assert response.status_code == 303, response.text
    return browser


def make_admin(client: TestClient, email: str = "root@example.com") -> TestClient:
    ctx = ctx_of(client)
    with ctx.db.session() as session:
        accounts.create_user(ctx, session, accounts.NewAccount(email, "admin password", Role.ADMIN))
    return form_login(client, email, "admin password")


def card(html: str, cpod_id: str) -> str:
    """The HTML of one CPod's card on the page."""
    match = re.search(rf'<article class="card cpod" id="cpod-{cpod_id}".*?</article>', html, re.S)
    assert match, f"no card for {cpod_id}"
    return match.group(0)


def status_of(html: str, cpod_id: str) -> str:
    match = re.search(r'data-status="([a-z]+)"', card(html, cpod_id))
    assert match
    return match.group(1)


def totals(html: str) -> dict[str, dict[str, int]]:
    """The GPU summary cards at the top: product -> {total, allocatable, available}."""
    result: dict[str, dict[str, int]] = {}
    section = re.search(r'<section class="summary" id="gpu-totals".*?</section>', html, re.S)
    assert section
    for product, body in re.findall(
        r'<div class="card stat-card gpu-total" data-product="([^"]+)">(.*?)</dl>', section.group(0), re.S
    ):
        result[product] = {k: int(v) for k, v in re.findall(r'data-field="(\w+)">(\d+)<', body)}
    return result


def two_cpods(client: TestClient, browser: TestClient) -> tuple[str, str, str]:
    """CPod "a" online with 2×8 A100 (2 used each) and a CPU node; CPod "b" offline with 1×8 A100.
    Returns (a_id, a_token, b_id)."""
    key = access_key(browser)
    a_id, a_token = register_cpod(client, key, "cluster-aaaa", name="train-a")
    b_id, b_token = register_cpod(client, key, "cluster-bbbb", name="train-b")
    assert beat(client, b_token, 1, [gpu_node("b-gpu-1")]) == 200
    ctx = ctx_of(client)
    # Two sweeps far in the future: online -> unknown -> offline. Then "a" comes online (now).
    sweep_liveness(ctx, now=utcnow() + FAR_FUTURE)
    sweep_liveness(ctx, now=utcnow() + FAR_FUTURE)
    nodes = [gpu_node("a-gpu-1"), gpu_node("a-gpu-2"), cpu_node("a-cpu-1")]
    assert beat(client, a_token, 1, nodes) == 200
    return a_id, a_token, b_id


def test_provider_sees_status_nodes_gpu_totals_and_events(client: TestClient) -> None:
    browser = signed_in_provider(client, "farm@example.com")
    a_id, _, b_id = two_cpods(client, browser)

    page = browser.get("/compute")
    assert page.status_code == 200
    assert page.headers["cache-control"] == "no-store"
    assert "script-src 'self'" in page.headers["content-security-policy"]
    html = page.text
    assert "还没有 CPod 上报算力" not in html
    assert "部署新的 CPod" in html and "--access-key=" in html  # deploy steps still reachable

    assert status_of(html, a_id) == "online" and status_of(html, b_id) == "offline"
    a, b = card(html, a_id), card(html, b_id)
    assert "train-a" in a and "在线" in a
    assert "train-b" in b and "离线" in b
    # Only online CPods count in the totals: 2 nodes × 8 on "a", 2 + 2 in use.
    assert totals(html) == {"NVIDIA-A100-SXM4-80GB": {"total": 16, "allocatable": 16, "available": 12}}

    rows = re.findall(r"<tr>\s*<td>(a-[a-z]+-\d)</td>(.*?)</tr>", a, re.S)
    assert [name for name, _ in rows] == ["a-gpu-1", "a-gpu-2", "a-cpu-1"]
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", rows[0][1], re.S)]
    assert cells == ["就绪", "NVIDIA-A100-SXM4-80GB", "80 GiB", "8", "8", "2", "96", "512"]
    cpu_cells = [
        re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", rows[2][1], re.S)
    ]
    assert cpu_cells == ["就绪", "—", "—", "0", "0", "0", "16", "64"]
    assert re.search(r'data-field="available">12<', a)  # the CPod's own GPU summary
    assert "最近一次上报" in b and "最近一次上报" not in a  # an offline CPod's nodes are its last report

    assert re.search(r'class="ago"[^>]*data-age="\d+">\d+ 秒前</time>', a)
    assert "local" in a and ">t<" in a  # runtime and agent version
    kinds = re.findall(r'<tr data-kind="(\w+)">', b)
    assert kinds == ["offline", "unknown", "online", "registered"]  # newest first
    assert "状态未知" in b and re.search(r"连续 \d+ 次未收到心跳", b)  # the service's details, localized
    assert "运行环境 local，agent 版本 t" in b
    assert "<details" in b and "事件记录" in b


def test_unknown_and_never_heartbeat(client: TestClient) -> None:
    browser = signed_in_provider(client, "farm@example.com")
    key = access_key(browser)
    quiet_id, _ = register_cpod(client, key, "cluster-quiet")
    late_id, late_token = register_cpod(client, key, "cluster-late")
    assert beat(client, late_token, 1, [gpu_node("n1")]) == 200
    sweep_liveness(ctx_of(client), now=utcnow() + timedelta(minutes=2))  # 3 × 10 s missed, within grace

    html = browser.get("/compute").text
    assert status_of(html, late_id) == "unknown" and "状态未知" in card(html, late_id)
    quiet = card(html, quiet_id)
    assert status_of(html, quiet_id) == "offline"
    assert "从未" in quiet and "尚未上报节点信息" in quiet
    assert "当前没有在线的 CPod 提供 GPU" in html  # the unknown one's GPUs are not counted
    # Said inside the CPod count's card: a half-width card of its own left a hole beside it.
    counts = re.search(r'<div class="card stat-card" id="cpod-counts">(.*?)\n  </div>', html, re.S)
    assert counts and 'id="no-online-gpus"' in counts.group(1)
    assert "stat-empty" not in html


def test_fragment_is_the_live_part_alone(client: TestClient) -> None:
    browser = signed_in_provider(client, "farm@example.com")
    a_id, _, b_id = two_cpods(client, browser)
    fragment = browser.get("/compute/fragment")
    assert fragment.status_code == 200
    assert fragment.headers["cache-control"] == "no-store"
    assert "frame-ancestors 'none'" in fragment.headers["content-security-policy"]
    assert "<html" not in fragment.text and "topbar" not in fragment.text
    assert 'class="live-root" data-shape="cpods"' in fragment.text
    assert status_of(fragment.text, a_id) == "online" and status_of(fragment.text, b_id) == "offline"
    assert "部署新的 CPod" not in fragment.text  # that part of the page is not live

    empty = signed_in_provider(client, "new@example.com").get("/compute/fragment")
    assert empty.status_code == 200 and 'data-shape="empty"' in empty.text and "train-a" not in empty.text

    signed_out = TestClient(client.app).get("/compute/fragment", follow_redirects=False)
    assert signed_out.status_code == 401  # not a redirect: fetch() would swap the login page in

    user = TestClient(client.app)
    register_form(user, "user", "dev@example.com")
    assert user.get("/compute/fragment").status_code == 403


def test_rename_through_the_form(client: TestClient) -> None:
    browser = signed_in_provider(client, "farm@example.com")
    a_id, _, _ = two_cpods(client, browser)
    token = csrf(browser, "/compute")

    done = browser.post(
        f"/compute/cpods/{a_id}/rename",
        data={"csrf_token": token, "name": "  北京-A100  "},
        follow_redirects=False,
    )
    assert done.status_code == 303
    assert done.headers["location"] == f"/compute?notice=cpod_renamed#cpod-{a_id}"
    assert browser.get(f"/api/v1/cpods/{a_id}").json()["name"] == "北京-A100"
    page = browser.get(done.headers["location"]).text
    assert "CPod 已重命名。" in page
    a = card(page, a_id)
    assert "北京-A100" in a
    renamed = re.search(r'<tr data-kind="renamed">(.*?)</tr>', a, re.S)
    assert renamed and "train-a → 北京-A100" in renamed.group(1) and "farm@example.com" in renamed.group(1)


def test_rename_errors_are_shown_in_place(client: TestClient) -> None:
    browser = signed_in_provider(client, "farm@example.com")
    a_id, _, b_id = two_cpods(client, browser)
    token = csrf(browser, "/compute")

    empty = browser.post(f"/compute/cpods/{a_id}/rename", data={"csrf_token": token, "name": "   "})
    assert empty.status_code == 422
    a = card(empty.text, a_id)
    assert 'class="rename-form has-error"' in a and "此项为必填项。" in a
    assert "此项为必填项。" not in card(empty.text, b_id)  # on that CPod's card only
    assert 'action="/compute/cpods/' in empty.text  # the whole page, ready to try again

    long_name = "x" * 65
    too_long = browser.post(f"/compute/cpods/{a_id}/rename", data={"csrf_token": token, "name": long_name})
    assert too_long.status_code == 422
    a = card(too_long.text, a_id)
    assert "名称最多 64 个字符。" in a and f'value="{long_name}"' in a  # what was typed is kept
    assert 'href="/lang/en?next=/compute"' in too_long.text  # the language link goes to the page itself
    assert browser.get(f"/api/v1/cpods/{a_id}").json()["name"] == "train-a"

    ok = browser.post(f"/compute/cpods/{a_id}/rename", data={"csrf_token": token, "name": "y" * 64})
    assert ok.status_code == 200 and "y" * 64 in card(ok.text, a_id)  # followed the redirect


def test_forms_without_csrf_are_refused_and_change_nothing(client: TestClient) -> None:
    browser = signed_in_provider(client, "farm@example.com")
    a_id, a_token, _ = two_cpods(client, browser)
    csrf(browser, "/compute")  # the CSRF cookie is set; the forms below send the wrong token or none

    for data in ({"csrf_token": "forged", "name": "stolen"}, {"name": "stolen"}):
        refused = browser.post(f"/compute/cpods/{a_id}/rename", data=data)
        assert refused.status_code == 403
        assert "页面已过期，请刷新后重试。" in refused.text
    for data in ({"csrf_token": "forged"}, {}):
        assert browser.post(f"/compute/cpods/{a_id}/revoke", data=data).status_code == 403

    body = browser.get(f"/api/v1/cpods/{a_id}").json()
    assert body["name"] == "train-a" and body["revoked"] is False
    assert beat(client, a_token, 2, [gpu_node("a-gpu-1")]) == 200  # its token still works


def test_revoke_through_the_form(client: TestClient) -> None:
    browser = signed_in_provider(client, "farm@example.com")
    a_id, a_token, b_id = two_cpods(client, browser)
    token = csrf(browser, "/compute")
    page = browser.get("/compute").text
    dialog = re.search(rf'<dialog id="revoke-{a_id}".*?</dialog>', page, re.S)
    assert dialog and f'action="/compute/cpods/{a_id}/revoke"' in dialog.group(0)
    assert "吊销 CPod「train-a」？" in dialog.group(0) and 'formmethod="dialog"' in dialog.group(0)

    done = browser.post(f"/compute/cpods/{a_id}/revoke", data={"csrf_token": token}, follow_redirects=False)
    assert done.status_code == 303
    assert done.headers["location"] == f"/compute?notice=cpod_revoked#cpod-{a_id}"
    assert beat(client, a_token, 2, [gpu_node("a-gpu-1")]) == 401  # the agent is cut off at once

    html = browser.get(done.headers["location"]).text
    assert "CPod 已吊销" in html
    a = card(html, a_id)
    assert status_of(html, a_id) == "revoked" and "已吊销" in a and "status-revoked" in a
    assert "rename-form" not in a and "revoke-button" not in a and "重新注册即可恢复" in a
    revoked = re.search(r'<tr data-kind="revoked">(.*?)</tr>', a, re.S)
    assert revoked and "farm@example.com" in revoked.group(1)
    assert "rename-form" in card(html, b_id)  # the other CPod keeps its actions
    assert "当前没有在线的 CPod 提供 GPU" in html  # its GPUs left the totals

    again = browser.post(f"/compute/cpods/{a_id}/revoke", data={"csrf_token": token}, follow_redirects=False)
    assert again.status_code == 303  # revoking twice is harmless
    events = browser.get(f"/api/v1/cpods/{a_id}/events").json()
    assert [e["kind"] for e in events].count("revoked") == 1


def test_another_provider_gets_403_and_changes_nothing(client: TestClient) -> None:
    owner = signed_in_provider(client, "farm@example.com")
    a_id, a_token, _ = two_cpods(client, owner)
    other = signed_in_provider(client, "rival@example.com")
    token = csrf(other, "/compute")

    page = other.get("/compute").text
    assert "还没有 CPod 上报算力" in page and "train-a" not in page and a_id not in page
    renamed = other.post(f"/compute/cpods/{a_id}/rename", data={"csrf_token": token, "name": "mine"})
    assert renamed.status_code == 403 and "您没有权限访问此页面" in renamed.text
    bad_name = other.post(f"/compute/cpods/{a_id}/rename", data={"csrf_token": token, "name": ""})
    assert bad_name.status_code == 403  # refused before the name is even looked at
    revoked = other.post(f"/compute/cpods/{a_id}/revoke", data={"csrf_token": token})
    assert revoked.status_code == 403
    assert other.post("/compute/cpods/no-such-cpod/revoke", data={"csrf_token": token}).status_code == 404

    body = owner.get(f"/api/v1/cpods/{a_id}").json()
    assert body["name"] == "train-a" and body["revoked"] is False
    assert beat(client, a_token, 2, [gpu_node("a-gpu-1")]) == 200


def test_compute_users_cannot_post_cpod_forms(client: TestClient) -> None:
    owner = signed_in_provider(client, "farm@example.com")
    a_id, _, _ = two_cpods(client, owner)
    user = TestClient(client.app)
    register_form(user, "user", "dev@example.com")
    token = csrf(user, "/account")
    assert user.post(f"/compute/cpods/{a_id}/revoke", data={"csrf_token": token}).status_code == 403
    assert owner.get(f"/api/v1/cpods/{a_id}").json()["revoked"] is False


def test_admin_sees_every_cpod_with_its_owner_and_may_rename_and_revoke(client: TestClient) -> None:
    farm = signed_in_provider(client, "farm@example.com")
    a_id, _, b_id = two_cpods(client, farm)
    lab = signed_in_provider(client, "lab@example.com")
    c_id, c_token = register_cpod(client, access_key(lab), "cluster-cccc", name="lab-h100")
    assert beat(client, c_token, 1, [gpu_node("c-1", used=0)]) == 200
    admin = make_admin(client)

    page = admin.get("/compute")
    assert page.status_code == 200
    html = page.text
    assert 'href="/compute"' in html and 'href="/admin/users"' in html  # both in the admin's nav
    for cpod_id, owner in ((a_id, "farm"), (b_id, "farm"), (c_id, "lab")):
        # On a line of its own and whole: never broken at its "@" (issue 26, point 12).
        email = f"{owner}@example.com"
        owner_dd = f'<dd class="cpod-owner" title="{email}">{email}</dd>'
        assert f'<div class="meta-owner"><dt>所属算力源</dt>{owner_dd}' in card(html, cpod_id)
    assert "--access-key=" not in html and "部署新的 CPod" not in html  # admins have no accessKey
    # Every provider's online GPUs: "a" 16 (12 free) + "c" 8 (8 free).
    assert totals(html) == {"NVIDIA-A100-SXM4-80GB": {"total": 24, "allocatable": 24, "available": 20}}
    fragment = admin.get("/compute/fragment").text
    assert all(cpod_id in fragment for cpod_id in (a_id, b_id, c_id))

    token = csrf(admin, "/compute")
    assert (
        admin.post(
            f"/compute/cpods/{c_id}/rename",
            data={"csrf_token": token, "name": "lab-renamed"},
            follow_redirects=False,
        ).status_code
        == 303
    )
    assert (
        admin.post(
            f"/compute/cpods/{c_id}/revoke", data={"csrf_token": token}, follow_redirects=False
        ).status_code
        == 303
    )
    body = lab.get(f"/api/v1/cpods/{c_id}").json()
    assert body["name"] == "lab-renamed" and body["revoked"] is True
    lab_page = lab.get("/compute").text
    events = re.findall(r'<tr data-kind="(renamed|revoked)">(.*?)</tr>', card(lab_page, c_id), re.S)
    assert [kind for kind, _ in events] == ["revoked", "renamed"]
    assert all("root@example.com" in row for _, row in events)  # the provider sees who did it


def test_admin_without_cpods_sees_an_empty_state(client: TestClient) -> None:
    html = make_admin(client).get("/compute").text
    assert "还没有 CPod 注册" in html and "--access-key=" not in html


def test_users_see_available_gpus(client: TestClient) -> None:
    user = TestClient(client.app)
    register_form(user, "user", "dev@example.com")
    account = user.get("/account").text
    assert 'href="/gpus"' in account and "可用算力" in account
    assert user.get("/compute").status_code == 403

    empty = user.get("/gpus")
    assert empty.status_code == 200 and "当前没有在线的 GPU" in empty.text
    assert empty.headers["x-frame-options"] == "DENY"

    farm = signed_in_provider(client, "farm@example.com")
    two_cpods(client, farm)
    page = user.get("/gpus").text
    assert "当前没有在线的 GPU" not in page
    match = re.search(r'data-product="NVIDIA-A100-SXM4-80GB">(.*?)</div>\s*</div>', page, re.S)
    assert match, page
    assert "80 GiB" in match.group(1)
    assert re.search(r'data-field="available">12<', match.group(1))  # offline "b" is not counted
    assert re.search(r'data-field="total">16<', match.group(1))
    assert "train-a" not in page and "farm@example.com" not in page  # no CPod or provider is named
    fragment = user.get("/gpus/fragment")
    assert (
        fragment.status_code == 200 and "<html" not in fragment.text and 'data-shape="list"' in fragment.text
    )
    assert TestClient(client.app).get("/gpus/fragment").status_code == 401
    assert (
        TestClient(client.app).get("/gpus", follow_redirects=False).headers["location"] == "/login?next=/gpus"
    )


def test_compute_page_in_english(client: TestClient) -> None:
    browser = signed_in_provider(client, "farm@example.com")
    a_id, _, b_id = two_cpods(client, browser)
    browser.get("/lang/en?next=/compute")
    html = browser.get("/compute").text
    a, b = card(html, a_id), card(html, b_id)
    assert "Online" in a and "Offline" in b and "Last heartbeat" in a
    assert re.search(r">\d+ s ago</time>", a)
    assert "Event history" in b and ">Registered<" in b and "Deploy another CPod" in html
    assert re.search(r"\d+ heartbeats missed", b) and "1 node reported" in b and "local agent t" in b
    assert 'data-ago-s="{n} s ago"' in html  # the patterns app.js ticks with
    assert "Revoke CPod “train-a”?" in a


def test_relative_times_sizes_and_event_details_in_both_languages() -> None:
    assert [ago("zh", s) for s in (None, 0, 59, 61, 7200, 3 * 86400)] == [
        "从未",
        "0 秒前",
        "59 秒前",
        "1 分钟前",
        "2 小时前",
        "3 天前",
    ]
    assert [ago("en", s) for s in (None, 12, 3599, 3600)] == ["never", "12 s ago", "59 min ago", "1 h ago"]
    assert [gib(m) for m in (81920, 1536, None)] == ["80", "1.5", "—"]
    both = Reason.of("cpod.again_revoked", runtime="kubernetes", version="1.2")
    assert event_detail("zh", both) == "吊销后重新注册；运行环境 kubernetes，agent 版本 1.2"
    assert event_detail("en", both) == "registered again after revocation; kubernetes agent 1.2"
    assert event_detail("en", counted("cpod.missed", 1)) == "1 heartbeat missed"
    assert event_detail("zh", counted("cpod.nodes", 2)) == "上报了 2 个节点"
    # Names people chose stay as they are; a row from before the codes is shown as it was stored.
    assert (
        event_detail("zh", Reason.of("cpod.renamed", old="local agent x", new="北京"))
        == "local agent x → 北京"
    )
    assert event_detail("zh", Reason.read("something new")) == "something new"
    assert event_detail("zh", None) == "—"


def test_the_card_says_whether_the_cpod_takes_fine_tunes_and_when_that_changed(client: TestClient) -> None:
    browser = signed_in_provider(client, "farm@example.com")
    key = access_key(browser)
    local_id, _ = register_cpod(client, key, "cluster-local")
    kube_id, kube_token = register_cpod(client, key, "cluster-kube", runtime="kubernetes")
    html = browser.get("/compute").text
    fine_tunes = r'class="cpod-fine-tunes">([^<]+)<'
    assert re.findall(fine_tunes, card(html, local_id)) == ["接受"]
    assert re.findall(fine_tunes, card(html, kube_id)) == ["不接受（agent 需 --trainer-image）"]
    assert 'data-kind="fine-tunes"' not in html  # a new CPod's registration says it all
    reply = client.put(
        "/api/v1/agent/isolation",
        headers={"Authorization": f"Bearer {kube_token}"},
        json={"fine_tunes": True},
    )
    assert reply.status_code == 200
    kube = card(browser.get("/compute").text, kube_id)
    assert re.findall(fine_tunes, kube) == ["接受"]
    assert 'data-kind="fine-tunes"' in kube and ">微调<" in kube and "开始接受微调任务" in kube
    cache = r'class="cpod-input-cache"[^>]*>(.*?)</dd>'
    assert re.findall(cache, kube) == ['<span class="muted">空</span>']
    assert "cpod-input-cache" not in card(html, kube_id)  # no fine-tunes: no line for a cache
    # The agent reports what it fetched (a model and a dataset): the provider sees it on the card.
    held = [{"sha256": "a" * 64, "size": 3 * 2**30 // 2}, {"sha256": "b" * 64, "size": 2**20}]
    assert beat(client, kube_token, 1, [], cache=held) == 200
    kube = card(browser.get("/compute").text, kube_id)
    assert re.findall(cache, kube) == ["2 项 · 1.5 GiB"]
    api = browser.get(f"/api/v1/cpods/{kube_id}")
    assert api.json()["input_cache"] == {"entries": 2, "bytes": 3 * 2**30 // 2 + 2**20}
    browser.get("/lang/en?next=/compute")
    kube = card(browser.get("/compute").text, kube_id)
    assert re.findall(fine_tunes, kube) == ["Taken"] and "now takes fine-tunes" in kube
    assert re.findall(cache, kube) == ["2 items · 1.5 GiB"]
