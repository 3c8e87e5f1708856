"""GPU-hours of every workspace in one calendar month (UTC), for platform admins: by workspace and
GPU type with totals, by user, and the same rows as CSV from the API."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from apps.accounting.tables import cross_table, month_page
from apps.web.common import admin_only, page


@admin_only
def usage(request: HttpRequest) -> HttpResponse:
    context = month_page(request.user, request.GET.get("month"))
    rows = context["report"].rows
    context.update(by_workspace=cross_table(rows, "workspace"), by_user=rows, live_workspaces=[])
    return page(request, "console/usage.html", context, status=400 if context["errors"] else 200)
