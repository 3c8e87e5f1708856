"""Query parameters of list endpoints: a `workspace` filter on every tenant list, and a 400 for a
parameter no filter, ordering or page knows (rather than ignoring it and answering with
everything, which reads as if the filter had matched)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.db.models import QuerySet
from django_filters import BooleanFilter, ChoiceFilter, DateTimeFilter, NumberFilter
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import extend_schema_field
from rest_framework.exceptions import ValidationError
from rest_framework.filters import BaseFilterBackend, OrderingFilter
from rest_framework.request import Request

from apps.workspaces.models import Workspace

# Understood on any endpoint: the response format DRF may be asked for.
ALWAYS = frozenset({"format"})
# The largest id a database row can have (a 64-bit key).
MAX_ID = 2**63 - 1


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": MAX_ID})
class IdFilter(NumberFilter):
    """An object by its id (`?instance=12`), not a choice among the objects: an id that matches none
    finds nothing (not a 400); what is no id at all is refused, as the schema says."""

    field_class = forms.IntegerField

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", MAX_ID)
        super().__init__(*args, **kwargs)


class WorkspaceFilter(BaseFilterBackend):
    """`?workspace=<name>` on lists of tenant data (views with a `workspace_field`)."""

    param = "workspace"

    @staticmethod
    def tenant_data(view: Any) -> bool:
        """Objects that belong to a workspace (not the workspaces themselves)."""
        queryset = getattr(view, "queryset", None)
        return getattr(view, "workspace_field", None) is not None and getattr(queryset, "model", None) is not Workspace

    def applies(self, view: Any) -> bool:
        return self.tenant_data(view) and getattr(view, "action", None) == "list"

    def filter_queryset(self, request: Request, queryset: QuerySet[Any], view: Any) -> QuerySet[Any]:
        if not self.applies(view) or self.param not in request.query_params:
            return queryset
        return queryset.filter(**{f"{view.workspace_field}__name": request.query_params[self.param]})

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        if not self.tenant_data(view):
            return []
        return [{"name": self.param, "required": False, "in": "query", "description": "Only this workspace's.",
                 "schema": {"type": "string"}}]  # fmt: skip


class KnownParameters(BaseFilterBackend):
    """Refuse, on a list, a query parameter that none of the view's filters, its ordering or its
    pagination reads: HTTP 400 naming it and what the endpoint knows."""

    def filter_queryset(self, request: Request, queryset: QuerySet[Any], view: Any) -> QuerySet[Any]:
        if getattr(view, "action", None) != "list":
            return queryset
        known = set(ALWAYS) | self._known(request, queryset, view)
        unknown = sorted(set(request.query_params) - known)
        if unknown:
            listed = ", ".join(sorted(known - ALWAYS)) or "none"
            raise ValidationError({name: [f"Unknown query parameter. This list knows: {listed}."] for name in unknown})
        errors: dict[str, list[str]] = {}
        booleans = self._booleans(request, queryset, view)
        moments = self._moments(request, queryset, view)
        choices = self._choices_of_lists(request, queryset, view)
        single_choices = self._single_choices(request, queryset, view)
        for name, values in request.query_params.lists():
            if len(values) > 1:
                errors[name] = ["Give this parameter once (several values: name__in=a,b where the list has it)."]
            elif "\x00" in values[0]:
                errors[name] = ["Null characters are not allowed."]
            elif name in booleans and values[0] not in ("true", "false"):
                errors[name] = ["Expected true or false."]
            elif name in moments and not values[0]:  # django-filter would take "" for no filter
                errors[name] = ["Give a date and time, such as 2026-11-25T09:00:00Z."]
            elif name in single_choices and not values[0]:  # the same: a choice, or leave the parameter out
                errors[name] = [f"Choose among: {', '.join(single_choices[name])}."]
            elif name in choices and values[0] and not set(values[0].split(",")) <= choices[name]:  # "": no filter
                wrong = sorted(set(values[0].split(",")) - choices[name])
                errors[name] = [f"Not a choice: {', '.join(wrong)}. Choose among: {', '.join(sorted(choices[name]))}."]
        if errors:
            raise ValidationError(errors)
        return queryset

    @staticmethod
    def _filters(queryset: QuerySet[Any], view: Any) -> dict[str, Any]:
        """The view's django-filter filters by parameter name (none without a filterset)."""
        for backend_class in view.filter_backends:
            backend = backend_class()
            if isinstance(backend, DjangoFilterBackend):
                filterset = backend.get_filterset_class(view, queryset)
                return dict(filterset.base_filters) if filterset is not None else {}
        return {}

    @classmethod
    def _booleans(cls, request: Request, queryset: QuerySet[Any], view: Any) -> set[str]:
        return {n for n, f in cls._filters(queryset, view).items() if isinstance(f, BooleanFilter)}

    @classmethod
    def _moments(cls, request: Request, queryset: QuerySet[Any], view: Any) -> set[str]:
        return {n for n, f in cls._filters(queryset, view).items() if isinstance(f, DateTimeFilter)}

    @classmethod
    def _single_choices(cls, request: Request, queryset: QuerySet[Any], view: Any) -> dict[str, list[str]]:
        """Parameters that take one of a field's choices: what each may be."""
        return {
            name: [str(value) for value, _ in filter_.extra["choices"]]
            for name, filter_ in cls._filters(queryset, view).items()
            if isinstance(filter_, ChoiceFilter) and isinstance(filter_.extra.get("choices"), (list, tuple))
        }

    @classmethod
    def _choices_of_lists(cls, request: Request, queryset: QuerySet[Any], view: Any) -> dict[str, set[str]]:
        """`name__in` parameters of a field with choices (a state): what each value may be. django-filter
        checks a single value against the choices, but not each of a list's."""
        found: dict[str, set[str]] = {}
        for name, filter_ in cls._filters(queryset, view).items():
            if filter_.lookup_expr != "in" or "__" in filter_.field_name:
                continue
            field = queryset.model._meta.get_field(filter_.field_name)
            if field.choices:
                found[name] = {str(value) for value, _ in field.flatchoices}
        return found

    @staticmethod
    def _known(request: Request, queryset: QuerySet[Any], view: Any) -> set[str]:
        known: set[str] = set()
        for backend_class in view.filter_backends:
            backend = backend_class()
            if isinstance(backend, DjangoFilterBackend):
                filterset = backend.get_filterset_class(view, queryset)
                if filterset is not None:
                    known |= set(filterset.base_filters)
            elif isinstance(backend, OrderingFilter):
                if backend.get_valid_fields(queryset, view, {"request": request}):
                    known.add(backend.ordering_param)
            elif isinstance(backend, WorkspaceFilter) and backend.applies(view):
                known.add(backend.param)
        paginator = getattr(view, "paginator", None)
        if paginator is not None:
            known |= {p for p in (getattr(paginator, "page_query_param", None),
                                  getattr(paginator, "page_size_query_param", None)) if p}  # fmt: skip
        return known
