"""The landing page (everything active in my workspaces, and what is shared with me) and the workspace
switcher."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse

from apps.compute.models import Instance, Notebook
from apps.jobs.models import Job
from apps.web.common import is_fragment, my_workspaces, page, shared_with, signed_in, workspace_for
from apps.web.usage import quota_use
from apps.workspaces.access import restrict

SHOWN = 8  # rows of each kind on the landing page; the list pages have the rest


@signed_in
def landing(request: HttpRequest) -> HttpResponse:
    workspaces = list(my_workspaces(request.user))
    instances = restrict(Instance.objects.filter(state__in=Instance.LIVE_STATES), request.user)
    notebooks = restrict(Notebook.objects.filter(state__in=Notebook.LIVE_STATES), request.user)
    jobs = restrict(Job.objects.filter(state__in=Job.ACTIVE_STATES), request.user)
    running = jobs.exclude(state=Job.State.QUEUED)
    queued = jobs.filter(state=Job.State.QUEUED).order_by("cluster_queue_position", "created_at")
    context = {
        "my_workspaces": workspaces,
        # Its own workspaces' changes, and those of the instances shared with the user.
        "live_workspaces": [w.name for w in workspaces] + [f"instance:{i.pk}" for i in shared_with(request)],
        "counts": {
            "instances": instances.count(),
            "notebooks": notebooks.count(),
            "running": running.count(),
            "queued": queued.count(),
        },
        "instances": instances.select_related("workspace", "profile")[:SHOWN],
        "notebooks": notebooks.select_related("workspace", "instance", "profile")[:SHOWN],
        "running_jobs": running.select_related("workspace")[:SHOWN],
        "queued_jobs": queued.select_related("workspace")[:SHOWN],
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
