"""Admin pages: the user list with role filter and search."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sxwl.cloud.db.models import Role
from sxwl.cloud.services.accounts import accounts
from sxwl.cloud.web.kit import Admin, ctx_of, render
from sxwl.protocol.fields import Int32

router = APIRouter(include_in_schema=False)


@router.get("/admin/users")
def admin_users(request: Request, principal: Admin, page: Int32 = 1, role: str = "", q: str = "") -> Response:
    role_filter = Role(role) if role in {r.value for r in Role} else None
    with ctx_of(request).db.session() as session:
        result = accounts.list_users(session, max(page, 1), 25, role_filter, q[:320])
    return render(
        request,
        "admin_users.html",
        principal,
        result=result,
        role=role_filter.value if role_filter else "",
        q=q,
        roles=[r.value for r in Role],
    )
