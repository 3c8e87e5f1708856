"""The landing page (everything active in my workspaces, and what is shared with me) and the workspace
switcher."""

from __future__ import annotations

from collections import Counter

from django.db.models import Count, F
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse

from apps.web.common import is_fragment, my_workspaces, page, shared_with, signed_in, workspace_for
from apps.web.usage import quota_use
from apps.web.worklist import KindPanel, has_pages, work_rows
from apps.workloads import listing
from apps.workloads.kinds import KINDS

SHOWN = 8  # rows of each kind on the landing page; the list pages have the rest


@signed_in
def landing(request: HttpRequest) -> HttpResponse:
    """Every kind's live workloads in the user's workspaces (and those shared with them), kind by
    kind, and the queue of all kinds: what a newly registered kind has shows here too."""
    workspaces = list(my_workspaces(request.user))
    mine = listing.visible(request.user)
    counts = Counter[tuple[str, str]]()
    for row in mine.filter(listing.in_states(listing.live)).values("kind", "state").annotate(n=Count("pk")).order_by():
        counts[(row["kind"], row["state"])] = row["n"]
    queue = mine.filter(listing.in_states(listing.queued))
    panels = []
    for name, info in KINDS.items():
        shown = [state for state in listing.live(info) if state not in listing.queued(info)]
        panels.append(
            KindPanel(
                name=name,
                label=info.label or name,
                count=sum(counts[name, state] for state in listing.live(info)),
                rows=work_rows(mine.filter(kind=name, state__in=shown), SHOWN),
                **has_pages(name),
            )
        )
    context = {
        "my_workspaces": workspaces,
        # Its own workspaces' changes, and those of the instances shared with the user.
        "live_workspaces": [w.name for w in workspaces] + [f"instance:{i.pk}" for i in shared_with(request)],
        "kinds": panels,
        "queued_count": sum(counts[info.name, state] for info in KINDS.values() for state in listing.queued(info)),
        "queue": work_rows(queue.order_by(F("cluster_queue_position").asc(nulls_last=True), "created_at"), SHOWN),
        "usage": quota_use(workspaces),
        "shown": SHOWN,
    }
    template = "web/_landing_body.html" if is_fragment(request) else "web/landing.html"
    return page(request, template, context)


@signed_in
def switch(request: HttpRequest) -> HttpResponse:
    """The switcher's form: go to the chosen workspace's overview."""
    name = request.GET.get("workspace", "")
    workspace = workspace_for(request, name)
    return redirect(reverse("web:dashboard", args=[workspace.name]))
