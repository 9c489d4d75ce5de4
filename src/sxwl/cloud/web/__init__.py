"""The server-rendered web console: ``kit`` (rendering, errors, who may see a page), one package of
pages per area (their routes in ``pages``, what they show in ``view``), the texts in ``i18n``,
assembled here."""

from __future__ import annotations

from fastapi import Depends, FastAPI
from fastapi.staticfiles import StaticFiles

from sxwl.cloud.api.deps import plain_parameters
from sxwl.cloud.web.account import pages as account_pages
from sxwl.cloud.web.admin import money_pages as money_admin_pages
from sxwl.cloud.web.admin import pages as admin_pages
from sxwl.cloud.web.auth import pages as auth_pages
from sxwl.cloud.web.compute import downloads
from sxwl.cloud.web.compute import pages as compute_pages
from sxwl.cloud.web.devenvs import pages as dev_pages
from sxwl.cloud.web.devenvs import proxy as dev_proxy
from sxwl.cloud.web.endpoints import pages as endpoints_pages
from sxwl.cloud.web.finetune import pages as finetune_pages
from sxwl.cloud.web.jobs import pages as jobs_pages
from sxwl.cloud.web.kit import HERE, PageRefused, error_page, page_refused
from sxwl.cloud.web.models import pages as models_pages
from sxwl.cloud.web.money import pages as billing_pages

# Console routers with routes that take more than the default body (a dataset's upload), each with
# its prefix, for the app's BodyRules (app.py).
BODY_RULED = (("", finetune_pages.router), ("", dev_proxy.router))


def install(app: FastAPI) -> None:
    # Path and query values the database cannot hold (NUL) are refused before any page runs.
    checked = [Depends(plain_parameters)]
    pages_of = (
        auth_pages,
        account_pages,
        compute_pages,
        jobs_pages,
        finetune_pages,
        dev_pages,
        models_pages,
        endpoints_pages,
        billing_pages,
        admin_pages,
        money_admin_pages,
        downloads,
    )
    for pages in pages_of:
        app.include_router(pages.router, dependencies=checked)
    # Its WebSocket route takes no Request: it checks its one path value itself (services/devenvs).
    app.include_router(dev_proxy.router)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.add_exception_handler(PageRefused, page_refused)
    app.state.html_error = error_page
