"""A page of fine-tunes costs the same few SQL statements however many finished or queued ones it
shows: their costs, CPods' heartbeats and prices are read for the page at once (billing.job_costs,
fine_tune_estimate.estimates); only a running one adds its step rate's one indexed query. And the
page says what each fine-tune's own page says (SQLite and PostgreSQL)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from sxwl.cloud.api.openai import fine_tuning
from sxwl.cloud.db.models import User
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.web.finetune import view as finetune_view
from tests.test_fine_tunes_api import URL, FineTunes
from tests.test_job_list_queries import statements


def _user(ft: FineTunes) -> User:
    with ft.ctx.db.session() as session:
        user = session.get(User, ft.user_id)
        assert user is not None
        session.expunge(user)
        return user


def test_a_page_of_ten_fine_tunes_costs_what_a_page_of_three_does(client: TestClient) -> None:
    ft = FineTunes(client)
    running, _ = ft.running()  # one started attempt on the CPod: its cost accrues from the heartbeat
    ft.created(gpus=64)  # no node has 64 GPUs: queued for ever
    cancelled = ft.created(gpus=64)
    assert ft.client.post(f"{URL}/{cancelled['id']}/cancel", headers=ft.user).status_code == 200
    user = _user(ft)

    def api_page() -> None:
        fine_tuning.list_jobs(user=user, ctx=ft.ctx, after=None, limit=50, all=False)

    def console_page() -> None:
        with ft.ctx.db.session() as session:
            finetune_view.fine_tune_list(session, user, utcnow(), None)

    few = statements(ft.ctx, api_page), statements(ft.ctx, console_page)
    for _ in range(7):
        ft.created(gpus=64)
    assert (statements(ft.ctx, api_page), statements(ft.ctx, console_page)) == few

    listed = {j["id"]: j for j in ft.client.get(URL, headers=ft.user, params={"limit": 50}).json()["data"]}
    assert len(listed) == 10
    for fine_tune_id in (running["id"], cancelled["id"]):
        alone = ft.get(fine_tune_id)
        assert listed[fine_tune_id]["cost"] == alone["cost"]
        assert listed[fine_tune_id]["progress"] == alone["progress"]
        assert listed[fine_tune_id]["status"] == alone["status"]
