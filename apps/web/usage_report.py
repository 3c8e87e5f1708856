"""A workspace's GPU-hours in one calendar month (UTC), for its owners (and platform admins): by
user and GPU type with totals, and the same rows as CSV from the API. Members and viewers are
refused (403); another tenant's workspace is not found (404)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from apps.accounting.tables import cross_table, month_page
from apps.web.common import page, signed_in, workspace_for
from apps.workspaces.access import MANAGE


@signed_in
def usage_report(request: HttpRequest, ws: str) -> HttpResponse:
    workspace = workspace_for(request, ws, MANAGE)
    context = month_page(request.user, request.GET.get("month"), workspace=workspace.name)
    context.update(workspace=workspace, by_user=cross_table(context["report"].rows, "user"))
    return page(request, "web/usage_report.html", context, status=400 if context["errors"] else 200)
