"""The portal's side of signing a browser in to a Ray cluster's dashboard (apps/rayclusters/signin.py).

A browser without the cluster host's cookie is sent here, to the portal's own origin, where the
portal's session lives. For a signed-in user who may see the cluster (a viewer included: the
dashboard in a browser only reads), it issues a one-time code and sends the browser to the
cluster host's ``/portal-auth/callback``, which the portal's proxy answers (apps/rayclusters/
proxy.py) by redeeming the code and setting that host's own cookie. The portal's cookies never
leave its own host.
"""

from __future__ import annotations

from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from apps.audit.actions import Origin
from apps.audit.models import AuditEvent
from apps.compute import hosts
from apps.rayclusters import signin
from apps.rayclusters.models import RayCluster
from apps.rayclusters.proxy import RUNNING
from apps.workspaces.access import VIEW, restrict


@never_cache
@require_GET
def authorize(request: HttpRequest, label: str) -> HttpResponse:
    """Sign the browser in to the dashboard of the cluster of ``label``: 404 alike for a cluster
    that does not exist and one the user cannot see, 503 while it does not run (no code is issued
    for a dashboard that is not there)."""
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path(), "web:login")
    pk = hosts.pk_of_label(label)
    cluster = restrict(RayCluster.objects.select_related("workspace"), request.user, VIEW).filter(pk=pk).first()
    if cluster is None or cluster.host_label != label:
        raise Http404("No such Ray cluster.")
    if cluster.state not in RUNNING or not cluster.proxy_target:
        state = cluster.get_state_display().lower()
        response = HttpResponse(
            f"The Ray cluster {cluster.name} is not running ({state}). Its dashboard opens once it runs.\n",
            status=503,
            content_type="text/plain; charset=utf-8",
        )
        response["Retry-After"] = "5"
        return response
    code = signin.do_issue_dashboard_code(
        cluster, acting_user=request.user, origin=Origin.from_request(request, AuditEvent.Via.WEB)
    )
    return HttpResponseRedirect(hosts.callback_url(label, code, request.GET.get("next", "/")))
