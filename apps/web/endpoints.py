"""Inference endpoints: the workspace's list, an endpoint's page (its URL and how to call it, its
replicas, its scaling decisions, why it failed, its figures over time, its server's log), its
charts' figures, a token made for calling it, and delete.

The list and the page are the generic ones (apps/web/generic.py), described here; the forms (new,
scale, update the model) are in apps/web/endpoint_forms.py. Every change goes through the
endpoint's actions (apps/inference/actions.py), as the API's do, and another tenant's endpoint is a
404 like every page's.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import messages
from django.db.models import Prefetch, QuerySet
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache

from apps.accounts.api_tokens import default_days_for, do_create_token
from apps.accounts.models import ApiToken
from apps.errors import ActionError
from apps.inference import actions
from apps.inference.api import EndpointTokenSerializer
from apps.inference.models import Endpoint, Replica, Sample
from apps.web import generic
from apps.web.common import (
    Errors,
    action_kwargs,
    get_for,
    is_fragment,
    page,
    serializer_context,
    signed_in,
    validated,
    workspace_for,
)
from apps.web.telemetry import gpu_answer, gpu_panel
from apps.workspaces.access import CHANGE
from apps.workspaces.models import Workspace

State = Endpoint.State
# The states in which an endpoint takes changes (its bounds, its model) and serves.
CHANGEABLE = (State.DEPLOYING, State.READY, State.IDLE)
SESSION_NEW_TOKEN = "web.endpoint_token"
# At most this many replicas are listed on an endpoint's page: the live ones, then the last ended.
REPLICAS_SHOWN = 12
SCALE_EVENTS_SHOWN = 20
# The charts' windows, and the most points a chart draws (samples are averaged into as many buckets).
WINDOWS = {"1h": timedelta(hours=1), "6h": timedelta(hours=6), "24h": timedelta(hours=24)}
MAX_POINTS = 180
STARTING = (Replica.State.QUEUED, Replica.State.ADMITTED, Replica.State.PREEMPTED)


def live_replicas() -> Prefetch:
    """An endpoint's replicas that have not ended, as ``endpoint.live_replicas``."""
    return Prefetch(
        "replicas", queryset=Replica.objects.exclude(state__in=Replica.FINAL_STATES), to_attr="live_replicas"
    )


def counts(endpoint: Endpoint) -> dict[str, Any]:
    """How many of its replicas serve and how many are on their way, from ``live_replicas``."""
    live = getattr(endpoint, "live_replicas", None)
    if live is None:
        live = list(endpoint.replicas.exclude(state__in=Replica.FINAL_STATES))
    return {
        "serving": sum(1 for r in live if r.state == Replica.State.READY),
        "starting": sum(1 for r in live if r.state in STARTING),
        "stopping": sum(1 for r in live if r.state == Replica.State.STOPPING),
        "rolling_out": any(r.version != endpoint.version for r in live),
        "changeable": endpoint.state in CHANGEABLE,
    }


# -- the list --------------------------------------------------------------------------------------

MODEL_CELL = (
    '{% if obj.source == "artifact" and obj.source_job_id %}artifact <code>{{ obj.source_artifact }}</code> of '
    "<a href=\"{% url 'web:job' workspace.name obj.source_job_id %}\">job #{{ obj.source_job_id }}</a>"
    '{% else %}<code class="path">{{ obj.model_path }}</code>{% endif %}'
)
REPLICAS_CELL = (
    "{% if obj.is_final %}—{% else %}"
    '<span class="nowrap">{{ serving }} serving / {{ obj.desired_replicas }} wanted</span>'
    '<div class="muted small">between {{ obj.min_replicas }} and {{ obj.max_replicas }}'
    "{% if obj.scale_to_zero_s %}, to zero after {{ obj.scale_to_zero_s|duration }} quiet{% endif %}"
    "{% if starting %} · {{ starting }} starting{% endif %}</div>{% endif %}"
)

LISTING = generic.Listing(
    kind="endpoint",
    title="Inference endpoints",
    intro="Models served at a stable URL (the OpenAI API), between a minimum and a maximum of replicas.",
    url_name="web:endpoints",
    rows=lambda workspace: (
        Endpoint.objects.filter(workspace=workspace)
        .select_related("created_by", "profile")
        .prefetch_related(live_replicas())
    ),
    new_url_name="web:endpoint-new",
    new_label="New endpoint",
    row_context=counts,
    tabs=(
        generic.Tab(
            "live",
            "Live",
            Endpoint.LIVE_STATES,
            "No endpoint is live",
            "Serve a model from the workspace's directory, or one a finished job left, at a URL of its own.",
        ),
        generic.Tab(
            "ended",
            "Ended",
            Endpoint.FINAL_STATES,
            "No ended endpoints yet",
            "Deleted and failed endpoints stay here with why they ended.",
        ),
        generic.Tab(
            "all",
            "All",
            None,
            "No endpoints yet",
            "An endpoint serves a model with an OpenAI-compatible server, scaled between a minimum and a "
            "maximum of replicas, each admitted under the workspace's quota.",
        ),
    ),  # fmt: skip
    columns=(
        generic.Column(
            "Endpoint",
            "<a href=\"{% url 'web:endpoint' workspace.name obj.pk %}\">{{ obj.name }}</a> "
            '<span class="muted small">#{{ obj.pk }}</span>'
            '{% if obj.created_by %}<div class="muted small">by {{ obj.created_by.get_username }}</div>{% endif %}',
        ),
        generic.Column(
            "State",
            '{% include "web/_state.html" with state=obj.state label=obj.get_state_display %}'
            '{% if rolling_out %}<div class="muted small">rolling out version {{ obj.version }}</div>{% endif %}',
        ),
        generic.Column("Replicas", REPLICAS_CELL),
        generic.Column(
            "URL",
            '{% if obj.is_final %}—{% else %}<code class="url">{{ obj.url }}</code>{% endif %}',
            classes="url-cell",
        ),
        generic.Column(
            "Profile",
            "{{ obj.profile.display_name|default:obj.profile.name }}"
            '<div class="muted small">{{ obj.profile.size_label }}</div>',
        ),
        generic.Column("Model", MODEL_CELL, classes="url-cell"),
        generic.Column(
            "Reason",
            "{% if obj.failure_reason %}{{ obj.failure_reason|truncatechars:120 }}{% endif %}",
            classes="reason",
        ),
    ),
)


@signed_in
def endpoint_list(request: HttpRequest, ws: str) -> HttpResponse:
    return generic.list_page(request, ws, LISTING)


# -- an endpoint's page ----------------------------------------------------------------------------

STATUS = generic.Panel(
    title="Status",
    live=True,
    shows_state=True,
    facts=(
        generic.Fact("URL", '{% if not obj.is_final %}<div class="secret"><code id="endpoint-url-text">{{ obj.url }}'
                     '</code><button type="button" class="btn btn-small" data-copy="endpoint-url-text">Copy'
                     '<span class="visually-hidden"> the URL</span></button></div><div class="muted small">'
                     "The OpenAI API: POST <code>/chat/completions</code> and <code>/completions</code> under it, "
                     "with a token (below).</div>{% endif %}", id="endpoint-url"),
        generic.Fact("Replicas", "{% if not obj.is_final %}{{ serving }} serving of {{ obj.desired_replicas }} wanted"
                     "{% if starting %}, {{ starting }} starting{% endif %}"
                     "{% if stopping %}, {{ stopping }} stopping{% endif %}"
                     '<div class="muted small">between {{ obj.min_replicas }} and {{ obj.max_replicas }}</div>'
                     "{% endif %}", id="endpoint-replicas"),
        generic.Fact("Scale to zero", "{% if obj.scale_to_zero_s %}after {{ obj.scale_to_zero_s|duration }} "
                     "without a request; the next request starts a replica and waits for it"
                     "{% elif not obj.is_final %}never: at least {{ obj.min_replicas }} "
                     "replica{{ obj.min_replicas|pluralize }} run{% endif %}"),
        generic.Fact("Version", "{{ obj.version }}{% if rolling_out %} · rolling out: the new replicas start "
                     "beside the old ones, which stop once as many new ones serve{% endif %}"),
        generic.Fact("Last request", "{% if obj.last_request_at %}<time "
                     "datetime=\"{{ obj.last_request_at|date:'c' }}\">"
                     '{{ obj.last_request_at|date:"j M Y, H:i:s" }}</time>{% endif %}'),
        generic.Fact("Failure", '{% if obj.state == "FAILED" and obj.failure_reason %}'
                     '<pre class="block log failure">{{ obj.failure_reason }}</pre>{% endif %}',
                     id="endpoint-failure"),
        generic.Fact("Last rollout", '{% if obj.state != "FAILED" and obj.failure_reason %}'
                     '<pre class="block log failure">{{ obj.failure_reason }}</pre>{% endif %}',
                     id="endpoint-rollout"),
        generic.Fact("Ended", '{% if obj.finished_at %}{{ obj.finished_at|date:"j M Y, H:i:s" }}{% endif %}'),
    ),
)  # fmt: skip

SPEC = generic.Panel(
    title="What it serves",
    live=True,
    facts=(
        generic.Fact("Model", MODEL_CELL + '{% if obj.source == "artifact" %}<div class="muted small">'
                     "in the workspace's directory: <code>{{ obj.model_path }}</code></div>{% endif %}",
                     id="endpoint-model"),
        generic.Fact("Profile", "{{ obj.profile.display_name|default:obj.profile.name }} · "
                     "{{ obj.profile.get_server_display }}<div class=\"muted small\">each replica "
                     "{{ obj.profile.size_label }}; {{ obj.profile.concurrency }} request"
                     "{{ obj.profile.concurrency|pluralize }} at once</div>", id="endpoint-profile"),
        generic.Fact("Model name", "<code>{{ obj.name }}</code>"
                     '<div class="muted small">the <code>model</code> of each request</div>'),
        generic.Fact("Description", "{{ obj.description }}"),
        generic.Fact("Created", '{{ obj.created_at|date:"j M Y, H:i:s" }}{% if obj.created_by %} by '
                     "{{ obj.created_by.get_username }}{% endif %}"),
    ),
)  # fmt: skip


def _url(name: str) -> Any:
    return generic.object_url(name)


DETAIL = generic.Detail(
    kind="endpoint",
    list_title="Inference endpoints",
    list_url_name="web:endpoints",
    url_name="web:endpoint",
    panels=(
        STATUS,
        SPEC,
        generic.Panel(title="Your new token", template="web/endpoint_token.html", wide=True, needs="new_token"),
        generic.Panel(title="Replicas", template="web/endpoint_replicas.html", live=True, wide=True),
        generic.Panel(title="Scaling decisions", template="web/endpoint_scaling.html", live=True, wide=True),
        generic.Panel(title="Figures", template="web/endpoint_charts.html", wide=True),
        generic.Panel(title="Call it", template="web/endpoint_call.html", wide=True, needs="callable"),
        generic.Panel(title="GPU utilisation", template="web/_gpu_panel.html", wide=True, needs="gpu_panel"),
        generic.Panel(title="Server log", template="web/endpoint_log.html", wide=True),
    ),
    actions=(
        generic.Action("Make a token", url=_url("web:endpoint-token"), role=CHANGE, method="post",
                       when=lambda endpoint: not endpoint.is_final),
        generic.Action("Scale…", url=_url("web:endpoint-scale"), role=CHANGE,
                       when=lambda endpoint: endpoint.state in CHANGEABLE),
        generic.Action("Update model…", url=_url("web:endpoint-update"), role=CHANGE,
                       when=lambda endpoint: endpoint.state in CHANGEABLE),
        generic.Action("Delete…", url=_url("web:endpoint-delete"), role=CHANGE, style="danger",
                       when=lambda endpoint: endpoint.state in CHANGEABLE),
    ),
)  # fmt: skip


def replica_rows(endpoint: Endpoint) -> list[Replica]:
    """The replicas to list: every live one (newest first), then the last ended ones."""
    replicas = Replica.objects.filter(endpoint=endpoint).select_related("cluster")
    live = list(replicas.exclude(state__in=Replica.FINAL_STATES).order_by("-pk")[:REPLICAS_SHOWN])
    ended = list(replicas.filter(state__in=Replica.FINAL_STATES).order_by("-finished_at", "-pk")[:REPLICAS_SHOWN])
    return (live + ended)[: max(REPLICAS_SHOWN, len(live))]


def endpoint_of(request: HttpRequest, workspace: Workspace, pk: int) -> Endpoint:
    """The endpoint of the URL, through the access layer: another tenant's is a 404."""
    queryset = Endpoint.objects.select_related("workspace", "profile", "created_by").prefetch_related(live_replicas())
    return get_for(request, queryset, pk=pk, workspace=workspace)  # type: ignore[no-any-return]


def page_context(request: HttpRequest, workspace: Workspace, endpoint: Endpoint) -> dict[str, Any]:
    replicas = replica_rows(endpoint)
    extra: dict[str, Any] = {
        **counts(endpoint),
        "replicas": replicas,
        "scale_events": list(endpoint.scale_events.all()[:SCALE_EVENTS_SHOWN]),
        "callable": not endpoint.is_final,
        "metrics_url": reverse("web:endpoint-metrics", args=[workspace.name, endpoint.pk]),
        "log_url": reverse("endpoint-logs", kwargs={"pk": endpoint.pk}),
        "log_replicas": replicas,
    }
    if is_fragment(request):
        return extra
    new_token = request.session.get(SESSION_NEW_TOKEN)
    if new_token and new_token.get("endpoint") == endpoint.pk:
        extra["new_token"] = request.session.pop(SESSION_NEW_TOKEN)
    if endpoint.profile.gpus:
        url = reverse("web:endpoint-gpu", args=[workspace.name, endpoint.pk])
        extra.update(gpu_panel(url=url, workload_id__in=_replica_ids(endpoint)))
    return extra


def _replica_ids(endpoint: Endpoint) -> QuerySet[Replica]:
    return Replica.objects.filter(endpoint=endpoint).values("pk")  # type: ignore[return-value]


@never_cache  # the page that shows a new token's text is never kept by a browser or a proxy
@signed_in
def endpoint_detail(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    workspace = workspace_for(request, ws)
    endpoint = endpoint_of(request, workspace, pk)
    context = generic.detail_context(request, workspace, endpoint, DETAIL, **page_context(request, workspace, endpoint))
    template = "web/generic/_live.html" if context["fragment"] else "web/endpoint_detail.html"
    return page(request, template, context)


@signed_in
def endpoint_gpu(request: HttpRequest, ws: str, pk: int) -> JsonResponse:
    """The GPU utilisation of its replicas over time (apps/web/telemetry.py), for its page's chart."""
    workspace = workspace_for(request, ws)
    endpoint = get_for(request, Endpoint.objects.all(), pk=pk, workspace=workspace)
    return gpu_answer(request, workload_id__in=_replica_ids(endpoint))


# -- its figures over time -------------------------------------------------------------------------

FIGURES = ("replicas", "serving", "waiting", "requests_per_s", "errors_per_s", "p50_s", "p95_s", "tokens_per_s")


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def figures(samples: list[Sample], start: Any, end: Any) -> dict[str, Any]:
    """The samples between `start` and `end` as at most MAX_POINTS buckets of equal time, each the
    mean of its samples (None where a bucket has none): labels (each bucket's end) and a series per
    figure; latencies in milliseconds."""
    step = (end - start) / MAX_POINTS
    buckets: list[list[Sample]] = [[] for _ in range(MAX_POINTS)]
    for sample in samples:
        index = min(MAX_POINTS - 1, int((sample.at - start) / step))
        buckets[index].append(sample)
    used = [i for i, bucket in enumerate(buckets) if bucket]
    first = used[0] if used else MAX_POINTS
    series: dict[str, list[float | None]] = {name: [] for name in FIGURES}
    labels = []
    for i in range(first, MAX_POINTS):
        labels.append((start + step * (i + 1)).isoformat())
        for name in FIGURES:
            value = _mean([getattr(s, name) for s in buckets[i]])
            if value is not None and name in ("p50_s", "p95_s"):
                value *= 1000
            series[name].append(None if value is None else round(value, 3))
    return {"labels": labels, "series": series}


@signed_in
def endpoint_metrics(request: HttpRequest, ws: str, pk: int) -> JsonResponse:
    """Its figures over the window asked for (1h, 6h, 24h), for its page's charts: replicas
    against its bounds, requests and errors per second, p50 and p95 latency, tokens per second."""
    workspace = workspace_for(request, ws)
    endpoint = get_for(request, Endpoint.objects.all(), pk=pk, workspace=workspace)
    window = request.GET.get("window", "1h")
    window = window if window in WINDOWS else "1h"
    end = timezone.now()
    start = end - WINDOWS[window]
    samples = list(Sample.objects.filter(endpoint=endpoint, at__gt=start, at__lte=end).order_by("at"))
    answer = figures(samples, start, end)
    answer.update(
        window=window,
        min_replicas=endpoint.min_replicas,
        max_replicas=endpoint.max_replicas,
        has_tokens=any(v is not None for v in answer["series"]["tokens_per_s"]),
        samples=len(samples),
    )
    return JsonResponse(answer)


# -- a token, and delete ---------------------------------------------------------------------------


@signed_in
def endpoint_token(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    """POST: make a token for calling this endpoint alone (the API's action, POST
    /api/v1/endpoints/<id>/tokens/, does the same); its page shows it once."""
    workspace = workspace_for(request, ws, CHANGE)
    endpoint = get_for(request, Endpoint.objects.select_related("workspace"), pk=pk, workspace=workspace)
    if request.method != "POST":
        return redirect("web:endpoint", ws=workspace.name, pk=endpoint.pk)
    errors: Errors = {}
    data = {"name": request.POST["name"].strip()} if request.POST.get("name", "").strip() else {}
    checked = validated(EndpointTokenSerializer(data=data, context=serializer_context(request)), errors)
    if endpoint.is_final:
        errors["form"] = [f"Endpoint {endpoint.name} has ended: it takes no token."]
    if checked is not None and not errors:
        try:
            token, text = do_create_token(
                request.user,
                name=checked.get("name", f"calls endpoint {endpoint.name}"),
                expires_in_days=default_days_for(request.user),
                scope=ApiToken.Scope.READ,
                endpoint=endpoint,
                limited=True,
                **action_kwargs(request),
            )
        except ActionError as exc:  # too many made this hour
            errors["form"] = [exc.message]
        else:
            request.session[SESSION_NEW_TOKEN] = {"endpoint": endpoint.pk, "name": token.name, "text": text}
            messages.success(request, f"Token {token.name} ({token.key_id}) was made: copy it now.")
    for message in errors.values():
        messages.error(request, " ".join(message))
    return redirect("web:endpoint", ws=workspace.name, pk=endpoint.pk)


@signed_in
def endpoint_delete(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    """GET asks first; POST stops every replica. Another tenant's is a 404; a viewer's try a 403."""
    workspace = workspace_for(request, ws, CHANGE)
    endpoint = get_for(request, Endpoint.objects.select_related("workspace"), pk=pk, workspace=workspace)
    errors: Errors = {}
    if request.method == "POST":
        try:
            actions.do_delete_endpoint(endpoint, **action_kwargs(request))
        except ActionError as exc:
            errors["form"] = [exc.message]
        else:
            messages.success(request, f"Endpoint {endpoint.name} is being deleted; its URL answers 404 from now on.")
            return redirect("web:endpoint", ws=workspace.name, pk=endpoint.pk)
    return generic.confirm_page(
        request,
        workspace,
        endpoint,
        DETAIL,
        question=f"Delete endpoint {endpoint.name}?",
        text=(
            "Its replicas stop at once, and requests in flight with them; its URL answers 404 from now on and its "
            "tokens call nothing. Its GPUs, CPU and memory go back to the workspace. Its record and scaling "
            "decisions stay here; the model's files stay where they are."
        ),
        button="Delete the endpoint",
        errors=errors,
    )


@signed_in
def replica_page(request: HttpRequest, ws: str, pk: int) -> HttpResponse:
    """A replica has no page of its own (the overview and the dashboards link each workload to
    one): its endpoint's."""
    workspace = workspace_for(request, ws)
    replica = get_for(request, Replica.objects.all(), pk=pk, workspace=workspace)
    return redirect("web:endpoint", ws=workspace.name, pk=replica.endpoint_id)
