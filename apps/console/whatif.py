"""What-if replays for admins: a form to replay a window of the portal's history under changes to
quotas, cohorts, policy and cluster size, the latest replays, and one replay's figures side by side
per workspace (apps/scheduling/whatif.py). The form is parsed by the API's own serializer."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.utils import timezone

from apps.errors import ActionError
from apps.scheduling import whatif
from apps.scheduling.api import WhatIfRequestSerializer, csv_response
from apps.scheduling.models import WhatIfReplay
from apps.web.common import Errors, action_kwargs, admin_only, page, refused, validated
from apps.web.templatetags.portal import duration

FIELDS = (
    "since",
    "until",
    "quotas",
    "cohorts",
    "policy",
    "preemption",
    "min_runtime_s",
    "starvation_s",
    "cluster_gpus",
)
LABELS = {
    "jobs": "Workloads",
    "not_run": "Never ran",
    "mean_wait_s": "Mean wait",
    "p95_wait_s": "p95 wait",
    "mean_jct_s": "Mean JCT",
    "preemptions": "Preemptions",
    "gpu_utilization": "GPU utilisation",
}
HIGHER_IS_BETTER = {"gpu_utilization"}
HEADLINE = ("mean_wait_s", "p95_wait_s", "mean_jct_s", "gpu_utilization")  # all workspaces', above the table
SIDES = (("baseline", "Today"), ("whatif", "What-if"))


@admin_only
def whatif_page(request: HttpRequest) -> HttpResponse:
    errors: Errors = {}
    now = timezone.now().replace(second=0, microsecond=0)
    values: dict[str, Any] = {
        "since": (now - timedelta(days=7)).strftime("%Y-%m-%d %H:%M"),
        "until": now.strftime("%Y-%m-%d %H:%M"),
    }
    if request.method == "POST":
        values = {name: request.POST.get(name, "").strip() for name in FIELDS}
        data = validated(WhatIfRequestSerializer(data=_request_data(values)), errors)
        for key in [key for key in errors if "." in key]:  # "quotas.0": one line of the form's field
            errors.setdefault(key.partition(".")[0], []).extend(errors.pop(key))
        if data is not None:
            try:
                run = whatif.check_start_whatif(**data, **action_kwargs(request))
            except ActionError as error:
                refused(error, errors, set(FIELDS))
            else:
                return redirect("console:whatif-run", pk=run.pk)
    base = whatif.today()
    context = {
        "base": base,
        "quota_rows": [
            (name, base.quotas.get(name, 0), cohort)
            for name, cohort in sorted(base.cohorts.items())
            if base.quotas.get(name) or cohort
        ],
        "runs": WhatIfReplay.objects.defer("result").select_related("created_by")[:20],
        "values": values,
        "errors": errors,
        "policies": whatif.POLICIES,
        "live_workspaces": [],
    }
    return page(request, "console/whatif.html", context, status=400 if errors else 200)


def _request_data(values: dict[str, str]) -> dict[str, Any]:
    """The form as the API's request: one change a line, empty fields left out."""
    data: dict[str, Any] = {}
    for name, value in values.items():
        if name in ("quotas", "cohorts"):
            data[name] = [line.strip() for line in value.splitlines() if line.strip()]
        elif name == "preemption":
            if value:
                data[name] = value == "on"
        elif value:
            data[name] = value
    return data


@admin_only
def whatif_run(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(WhatIfReplay.objects.select_related("created_by"), pk=pk)
    rows = _rows(run.result) if run.result else []
    context = {
        "run": run,
        "changes": whatif.Changes.from_json(run.changes).describe(),
        "labels": LABELS,
        "rows": rows,
        "headline": [cell for cell in rows[0]["cells"] if cell["figure"] in HEADLINE] if rows else [],
        "setups": [(title, _setup(run.result["settings"][side])) for side, title in SIDES] if run.result else [],
        "live_workspaces": [],
    }
    return page(request, "console/whatif_run.html", context)


def _rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per workspace, each figure as (what-if, today, tone): tone says whether the change helps."""
    rows = []
    for row in whatif.side_by_side(result):
        cells = []
        for figure in whatif.FIGURES:
            before, after = row[figure]
            better = after > before if figure in HIGHER_IS_BETTER else after < before
            tone = "" if after == before else "ok" if better else "bad"
            texts = {"after": _text(figure, after), "before": _text(figure, before)}
            cells.append({"figure": figure, "label": LABELS[figure], "tone": tone, **texts})
        rows.append({"workspace": row["workspace"], "cells": cells})
    return rows


def _setup(setup: dict[str, Any]) -> dict[str, Any]:
    """A replayed setup as the page shows it: quotas and cohorts as one line each."""
    quotas = ", ".join(f"{name} {gpus}" for name, gpus in setup["quotas"].items() if gpus)
    cohorts = ", ".join(f"{name}: {cohort}" for name, cohort in setup["cohorts"].items())
    return {**setup, "quotas_text": quotas, "cohorts_text": cohorts}


def _text(figure: str, value: float) -> str:
    if figure == "gpu_utilization":
        return f"{value:.1%}"
    if figure.endswith("_s"):
        return duration(value)
    return str(value)


@admin_only
def whatif_csv(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(WhatIfReplay, pk=pk, result__isnull=False)
    return csv_response(run)
