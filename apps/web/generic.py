"""Pages every kind of workload shares, as NetBox's generic views are shared: a list page (tabs
over states and a table) and a detail page (a header with the name and the actions, panels of
facts and the kind's own sections), each driven by a short description of the kind in Python.

A kind describes its list as a `Listing` (its tabs, and its table's `Column`s) and its page as a
`Detail` (its `Panel`s of `Fact`s, or of a template of their own, and its `Action`s). The views here
render the description and re-render the live parts when the kind's live events arrive
(static/web/live.js fires "live-<kind>" and "live-<kind>-<id>" for each change it hears). A list
finds its workspace through the access layer; a page is given its object, which its kind's view
found through the access layer (another tenant's is a 404; an instance or a notebook is found for
those it is shared with too, `shared_for`).

Cells, facts and the other snippets of a description are small Django templates, written in the
kind's description, with the portal's filters loaded; each sees the object as ``obj``, the
``workspace``, and what the kind adds (a list its ``row_context`` and ``page_context``, a page its
view). A fact that renders to nothing is left out, so a fact says when it applies
(``{% if obj.exit_code is not None %}...``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from django.core.paginator import Page, Paginator
from django.db.models import Model, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.middleware.csrf import get_token
from django.template import engines
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import slugify

from apps.web.common import is_fragment, may_change, page, workspace_for
from apps.workspaces.access import USE, may
from apps.workspaces.models import Workspace

PER_PAGE = 50
RowContext = Callable[[Any], dict[str, Any]]
PageContext = Callable[[Workspace], dict[str, Any]]


@cache
def _compiled(code: str) -> Any:
    return engines["django"].from_string("{% load portal %}" + code)


def render_snippet(code: str, context: dict[str, Any]) -> SafeString:
    """A cell's or a fact's template, rendered (autoescaped) and trimmed."""
    rendered: str = _compiled(code).render(context)
    return mark_safe(rendered.strip())


def _no_extra(obj: Any) -> dict[str, Any]:
    return {}


def render_optional(code: str, context: dict[str, Any]) -> SafeString:
    """A snippet a description may leave blank: blank renders nothing."""
    return render_snippet(code, context) if code else mark_safe("")


# -- the list ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """One column of a list's table: its header, and its cells' template."""

    label: str
    template: str
    classes: str = ""  # of its cells: "num" (right-aligned figures), "reason" (a muted explanation)
    head_classes: str = ""
    hide_label: bool = False  # said to screen readers alone (a column of buttons)


@dataclass(frozen=True)
class Tab:
    """Which rows a tab shows (``states``: None for all; ``where``: a further condition), in which
    order, and what it says empty."""

    key: str
    label: str
    states: tuple[str, ...] | None
    empty_title: str
    empty_text: str = ""
    order_by: tuple[Any, ...] = ()
    where: Q | None = None


@dataclass(frozen=True)
class Listing:
    """A kind's list page. ``kind`` names its live events and its rows' data attributes
    (``data-<kind>="<name>"``, ``data-<kind>-id``); ``rows`` gives a workspace's rows with what
    the cells read joined in, so a page costs the same queries for one row as for fifty.

    An empty tab says its ``empty_title``, then its ``empty_text`` and the button to make one; or,
    where the listing has an ``empty`` template, what that renders (with ``page_context``'s keys,
    given the workspace, beside the page's)."""

    kind: str
    title: str  # "Jobs"
    intro: str
    url_name: str
    rows: Callable[[Workspace], QuerySet[Any]]
    columns: tuple[Column, ...]
    tabs: tuple[Tab, ...]
    new_url_name: str = ""
    new_label: str = ""
    row_context: RowContext = _no_extra
    tab_param: str = "tab"  # the query parameter that names the tab: ?tab=queue
    empty: str = ""
    page_context: PageContext = _no_extra

    def tab(self, key: str | None) -> Tab:
        """The tab named `key`; the first for an unknown one."""
        return next((tab for tab in self.tabs if tab.key == key), self.tabs[0])


@dataclass(frozen=True)
class Cell:
    label: str
    classes: str
    html: SafeString


@dataclass(frozen=True)
class Row:
    obj: Any
    cells: list[Cell]


def table_rows(listing: Listing, objects: Iterable[Any], base: dict[str, Any]) -> list[Row]:
    """Each object's cells, rendered from the listing's columns with the page's `base` context."""
    rows = []
    for obj in objects:
        context = {**base, "obj": obj, **listing.row_context(obj)}
        cells = [
            Cell("" if c.hide_label else c.label, c.classes, render_snippet(c.template, context))
            for c in listing.columns
        ]
        rows.append(Row(obj, cells))
    return rows


def tab_rows(listing: Listing, workspace: Workspace, tab: Tab) -> QuerySet[Any]:
    rows = listing.rows(workspace)
    if tab.states is not None:
        rows = rows.filter(state__in=tab.states)
    if tab.where is not None:
        rows = rows.filter(tab.where)
    return rows.order_by(*tab.order_by) if tab.order_by else rows


def list_page(request: HttpRequest, ws: str, listing: Listing) -> HttpResponse:
    """The workspace's rows of one kind, a tab and a page at a time; with ``?part=table`` (htmx,
    on a live event), the table alone."""
    workspace = workspace_for(request, ws)
    tab = listing.tab(request.GET.get(listing.tab_param))
    page_obj: Page[Any] = Paginator(tab_rows(listing, workspace, tab), PER_PAGE).get_page(request.GET.get("page"))
    context = {"workspace": workspace, "may_change": may_change(request, workspace), **listing.page_context(workspace)}
    context["csrf_token"] = get_token(request)  # for a form in a cell
    context.update(
        listing=listing,
        tab=tab.key,
        tab_query=f"{listing.tab_param}={tab.key}&",
        current_tab=tab,
        page_obj=page_obj,
        rows=table_rows(listing, page_obj.object_list, context),
    )
    if not context["rows"]:
        context["empty"] = render_optional(listing.empty, context)
    template = "web/generic/_table.html" if is_fragment(request) else "web/generic/list.html"
    return page(request, template, context)


# -- the detail page ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Fact:
    """One line of a panel: its label, and its value's template (blank: the line is left out)."""

    label: str
    template: str
    id: str = ""  # the value's element id, for links and tests


@dataclass(frozen=True)
class Panel:
    """A titled panel of facts, or a template of its own (which renders its whole <section>).

    A ``live`` panel is rendered again with each live update of the object; panels sit two to a
    row unless ``wide`` (a lone one takes the row). ``needs`` names a context key that must be
    true for the panel to show (``gpu_panel``: only for a workload that holds GPUs). A panel of
    facts is ``<section id="<kind>-<slug of its title>">``; ``lead`` and ``foot`` are templates
    rendered above and below its facts (a progress bar, a button, a note)."""

    title: str = ""
    facts: tuple[Fact, ...] = ()
    template: str = ""
    live: bool = False
    wide: bool = False
    needs: str = ""
    shows_state: bool = False  # the object's state badge in the panel's head
    empty: str = ""  # said when none of its facts applies
    lead: str = ""
    foot: str = ""

    @property
    def slug(self) -> str:
        return slugify(self.title) or "panel"


@dataclass(frozen=True)
class Action:
    """A button in the page's header, for those who hold ``role`` on the object, while ``when``.

    ``url`` gives its address from the workspace and the object. A ``post`` action is a form
    that changes state at once; a ``get`` one is a link (to a confirmation page, or elsewhere).
    ``needs``, as a panel's, names a key of the page's context that must be true for it to show."""

    label: str
    url: Callable[[Workspace, Any], str]
    role: str = USE
    style: str = ""  # "primary", "danger" or "" (a plain button)
    method: str = "get"
    when: Callable[[Any], bool] = lambda obj: True
    external: bool = False  # opens in a new tab (a cluster's dashboard)
    download: bool = False  # a file to save (a kubeconfig)
    needs: str = ""


def object_url(name: str) -> Callable[[Workspace, Any], str]:
    """An action's ``url``: the object's route `name`, in its workspace (``w/<ws>/<kind>/<pk>/...``)."""
    return lambda workspace, obj: reverse(name, args=[workspace.name, obj.pk])


@dataclass(frozen=True)
class Detail:
    """A kind's detail page (and the confirmation pages of its actions).

    Its crumbs start with a link back to the list, or with what the ``crumb`` template renders (for
    one who sees the object without its workspace: a collaborator); ``subtitle``, a template too,
    is a line under its heading."""

    kind: str  # its live events: "live-<kind>-<id>"
    list_title: str  # "Ray clusters": the crumb back to the list
    list_url_name: str
    url_name: str  # this page's, refreshed with ?part=status
    panels: tuple[Panel, ...]
    actions: tuple[Action, ...] = ()
    crumb: str = ""
    subtitle: str = ""


@dataclass(frozen=True)
class ShownFact:
    label: str
    id: str
    html: SafeString


@dataclass(frozen=True)
class ShownPanel:
    spec: Panel
    facts: list[ShownFact] = field(default_factory=list)
    lead: SafeString = mark_safe("")
    foot: SafeString = mark_safe("")


@dataclass(frozen=True)
class ShownAction:
    spec: Action
    href: str


def _rows_of(panels: list[ShownPanel]) -> list[list[ShownPanel]]:
    """Panels as the page's rows: two half-width panels side by side, a wide or lone one alone."""
    rows: list[list[ShownPanel]] = []
    waiting: ShownPanel | None = None
    for panel in panels:
        if panel.spec.wide:
            if waiting is not None:
                rows.append([waiting])
                waiting = None
            rows.append([panel])
        elif waiting is None:
            waiting = panel
        else:
            rows.append([waiting, panel])
            waiting = None
    if waiting is not None:
        rows.append([waiting])
    return rows


def allowed_actions(
    request: HttpRequest, workspace: Workspace, obj: Model, detail: Detail, context: dict[str, Any]
) -> list[ShownAction]:
    """The actions that apply to the object now (`context`: the page's, that an action `needs`)
    and that the user may take (one query per role)."""
    held: dict[str, bool] = {}
    shown = []
    for action in detail.actions:
        if not action.when(obj) or (action.needs and not context.get(action.needs)):
            continue
        if action.role not in held:
            held[action.role] = may(request.user, obj, action.role)
        if held[action.role]:
            shown.append(ShownAction(action, action.url(workspace, obj)))
    return shown


def detail_context(
    request: HttpRequest, workspace: Workspace, obj: Model, detail: Detail, **extra: Any
) -> dict[str, Any]:
    """What the detail page (or, with ``?part=status``, its live part alone) renders."""
    fragment = is_fragment(request)
    context: dict[str, Any] = {"workspace": workspace, "obj": obj, "detail": detail, "fragment": fragment, **extra}
    # The state the page was rendered in (its live part's ``shown``): once the object has left it, what
    # the page's flash messages announced ("Notebook lab is starting.") has passed, and they go.
    shown = request.GET.get("shown", "")
    context["state_passed"] = fragment and bool(shown) and shown != getattr(obj, "state", shown)
    context["csrf_token"] = get_token(request)  # for a form in a snippet (a panel's button)
    context["actions"] = allowed_actions(request, workspace, obj, detail, context)
    live: list[ShownPanel] = []
    still: list[ShownPanel] = []
    for panel in detail.panels:
        if (panel.needs and not context.get(panel.needs)) or (fragment and not panel.live):
            continue
        facts = []
        for fact in panel.facts:
            html = render_snippet(fact.template, context)
            if html:
                facts.append(ShownFact(fact.label, fact.id, html))
        lead, foot = render_optional(panel.lead, context), render_optional(panel.foot, context)
        (live if panel.live else still).append(ShownPanel(panel, facts, lead, foot))
    context["live_rows"] = _rows_of(live)
    context["still_rows"] = _rows_of(still)
    if not fragment:
        _head(detail, context)
    return context


def _head(detail: Detail, context: dict[str, Any]) -> None:
    """The crumb before the object's name and the line under its heading, where the kind has them."""
    context["crumb"] = render_optional(detail.crumb, context)
    context["subtitle"] = render_optional(detail.subtitle, context)


def detail_page(
    request: HttpRequest, workspace: Workspace, obj: Model, detail: Detail, *, status: int = 200, **extra: Any
) -> HttpResponse:
    """The page (``status``: 400 where it shows a refused form of its own, a panel's), or with
    ``?part=status`` its live part alone."""
    context = detail_context(request, workspace, obj, detail, **extra)
    template = "web/generic/_live.html" if context["fragment"] else "web/generic/detail.html"
    return page(request, template, context, status=status)


def confirm_page(
    request: HttpRequest,
    workspace: Workspace,
    obj: Model,
    detail: Detail,
    *,
    question: str,
    text: str,
    button: str,
    errors: dict[str, list[str]] | None = None,
    refused_status: int = 400,
    **extra: Any,
) -> HttpResponse:
    """Ask before an action that cannot be undone; the form posts back to the same address. `text`
    is escaped unless marked safe (format_html); a refusal of the action (`errors`) answers
    `refused_status`; `extra` is what the kind's crumb template reads."""
    context = {
        "workspace": workspace,
        "obj": obj,
        "detail": detail,
        "question": question,
        "text": text,
        "button": button,
        "errors": errors or {},
        **extra,
    }
    _head(detail, context)
    return page(request, "web/generic/confirm.html", context, status=refused_status if errors else 200)
