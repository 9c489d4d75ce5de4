"""An administrator's fine-tune list on the console: their own by default, every user's with the
"all users" toggle, each row naming its user, the pager keeping the toggle; anyone else's `all=1`
changes nothing (SQLite and PostgreSQL)."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from sxwl.cloud.web.finetune import view as finetune_view
from tests.test_console_billing import admin_browser
from tests.test_console_compute import form_login
from tests.test_fine_tunes_api import FineTunes


def keys(html: str) -> list[str]:
    return re.findall(r'<tr data-key="([^"]+)"', html)


def test_the_all_users_toggle_lists_every_users_fine_tunes_with_their_email(client: TestClient) -> None:
    ft = FineTunes(client)
    made = [ft.created(gpus=64, suffix=f"run{i}")["id"] for i in range(3)]  # queued: no node has 64
    admin = admin_browser(client)
    own = admin.get("/finetune").text
    assert 'id="ft-all-users"' in own and "我的微调" in own
    assert keys(own) == [] and 'id="ft-empty"' in own
    everyone = admin.get("/finetune?all=1").text
    assert keys(everyone) == made[::-1]  # newest first
    owner = '<td class="job-owner" title="dev@example.com"><span class="email">dev</span><wbr>'
    assert everyone.count(owner) == 3 and "提交者" in everyone
    assert 'data-live-src="/finetune/fragment?all=1"' in everyone  # the live part keeps the toggle
    assert keys(admin.get("/finetune/fragment?all=1").text) == made[::-1]

    # A page boundary inside every user's list: the next page's link keeps all=1.
    limit = finetune_view.LIST_LIMIT
    finetune_view.LIST_LIMIT = 2
    try:
        first = admin.get("/finetune?all=1").text
        link = re.search(r'rel="next" href="([^"]+)"', first)
        assert link is not None and link.group(1) == f"/finetune?all=1&amp;after={made[1]}"
        assert keys(admin.get(link.group(1).replace("&amp;", "&")).text) == [made[0]]
    finally:
        finetune_view.LIST_LIMIT = limit

    # The user's own `all=1` shows their own list, without the toggle or the user column.
    user = form_login(client, "dev@example.com", "correct horse")
    theirs = user.get("/finetune?all=1").text
    assert keys(theirs) == made[::-1] and 'id="ft-all-users"' not in theirs and "job-owner" not in theirs


def test_with_no_fine_tune_anywhere_the_all_users_list_says_so(client: TestClient) -> None:
    admin = admin_browser(client)
    assert 'id="ft-empty-everyone"' in admin.get("/finetune?all=1").text
    admin.get("/lang/en?next=/finetune")
    english = admin.get("/finetune?all=1").text
    assert "No user has started a fine-tune yet" in english and "My fine-tunes" in english
