"""Applying a set of manifest documents in one transaction, and exporting today's platform as one.

``apply_documents`` checks each document's shape, then, in the order the kinds depend on each
other (groups and clusters before the profiles, workspaces and rules that name them), validates
each with its kind (apps/manifests/kinds.py) and makes its changes through the actions, each in
a savepoint so that one refusal does not hide the next. With ``prune``, the objects of the kinds
the documents name that no document names are then deleted, last dependent first, through the
same actions (which refuse what is in use). If any document is refused, or for a dry run, the
whole transaction is rolled back: nothing is written, and the plan says what would have been.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, transaction
from rest_framework.exceptions import ValidationError as DRFValidationError

from apps.errors import ActionError
from apps.manifests.errors import Invalid
from apps.manifests.kinds import (
    API_VERSION,
    AlertRuleKind,
    ClusterKind,
    CohortKind,
    ComputeProfileKind,
    Context,
    GroupKind,
    InferenceProfileKind,
    Kind,
    NodePoolKind,
    NotebookProfileKind,
    action_error,
    spec_errors,
)
from apps.manifests.workspaces import WorkspaceKind

# In the order they are applied: each kind may name objects of the kinds before it.
KINDS: dict[str, Kind] = {
    kind.kind: kind
    for kind in (
        GroupKind(), ClusterKind(), NodePoolKind(), ComputeProfileKind(), NotebookProfileKind(),
        InferenceProfileKind(), CohortKind(), WorkspaceKind(), AlertRuleKind(),
    )
}  # fmt: skip
MAX_DOCUMENTS = 5000
TOP_LEVEL = {"apiVersion", "kind", "metadata", "spec"}
PRUNE = "(prune)"


@dataclass(frozen=True)
class Problem:
    """Why one document (or one deletion of ``--prune``) was refused, and where."""

    source: str
    index: int | None
    kind: str
    name: str
    field: str
    message: str

    @property
    def text(self) -> str:
        where = f"{self.source}, document {self.index}" if self.index is not None else self.source
        what = f" ({self.kind} {self.name})" if self.kind and self.name else (f" ({self.kind})" if self.kind else "")
        return f"{where}{what}: {self.field + ': ' if self.field else ''}{self.message}"

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "index": self.index, "kind": self.kind, "name": self.name,
                "field": self.field, "message": self.message, "text": self.text}  # fmt: skip


@dataclass
class Document:
    """One document as sent: the file it came from and its position there (from 1)."""

    source: str
    index: int
    manifest: Any
    kind: str = ""
    name: str = ""
    spec: dict[str, Any] = field(default_factory=dict)

    def problem(self, where: str, message: str) -> Problem:
        return Problem(self.source, self.index, self.kind, self.name, where, message)


@dataclass
class Outcome:
    results: list[dict[str, Any]]
    problems: list[Problem]
    applied: bool


def read_documents(items: Iterable[Any]) -> tuple[list[Document], list[Problem]]:
    """The request's documents, each checked for its shape: apiVersion, a kind this portal manages,
    metadata.name, a spec object; a kind and name given twice is refused the second time."""
    documents: list[Document] = []
    problems: list[Problem] = []
    seen: dict[tuple[str, str], Document] = {}
    for position, item in enumerate(items, start=1):
        item = item if isinstance(item, dict) else {"manifest": item}
        source = item.get("source") if isinstance(item.get("source"), str) else "(request)"
        given = item.get("index")
        index = given if isinstance(given, int) else position
        doc = Document(str(source)[:500], index, item.get("manifest"))
        found = _shape_problems(doc)
        if found:
            problems += found
            continue
        if (doc.kind, doc.name) in seen:
            first = seen[(doc.kind, doc.name)]
            problems.append(doc.problem("metadata.name", f"Also given in {first.source}, document {first.index}."))
            continue
        seen[(doc.kind, doc.name)] = doc
        documents.append(doc)
    return documents, problems


def _shape_problems(doc: Document) -> list[Problem]:
    manifest = doc.manifest
    if not isinstance(manifest, dict):
        return [doc.problem("", "A document is an object with apiVersion, kind, metadata and spec.")]
    kind = manifest.get("kind")
    doc.kind = kind if isinstance(kind, str) else ""
    metadata = manifest.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    doc.name = name if isinstance(name, str) else ""
    problems = []
    if manifest.get("apiVersion") != API_VERSION:
        problems.append(doc.problem("apiVersion", f"Expected {API_VERSION}."))
    if doc.kind not in KINDS:
        problems.append(doc.problem("kind", f"Expected one of: {', '.join(KINDS)}."))
    if not doc.name.strip():
        problems.append(doc.problem("metadata.name", "Give the object's name."))
    elif isinstance(metadata, dict) and set(metadata) - {"name", "labels", "annotations"}:
        extra = ", ".join(sorted(set(metadata) - {"name", "labels", "annotations"}))
        problems.append(doc.problem("metadata", f"Unknown field {extra}: metadata takes name (labels, annotations)."))
    spec = manifest.get("spec", {})
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        problems.append(doc.problem("spec", "Expected an object."))
    else:
        doc.spec = spec
    for key in sorted(set(manifest) - TOP_LEVEL - {"status"}):
        problems.append(doc.problem(key, "Unknown field: a document has apiVersion, kind, metadata and spec."))
    return problems


def apply_documents(items: list[Any], *, ctx: Context, dry_run: bool = False, prune: bool = False) -> Outcome:
    """Validate and apply ``items`` (``{"source", "index", "manifest"}``) in one transaction; see the
    module docstring. Nothing is written when any problem is found, or for a dry run."""
    documents, problems = read_documents(items)
    order = list(KINDS)
    documents.sort(key=lambda d: order.index(d.kind))
    results: list[dict[str, Any]] = []
    with transaction.atomic():
        for doc in documents:
            result, found = _apply_one(doc, ctx)
            problems += found
            if result is not None:
                results.append(result)
        if prune:
            deleted, found = _prune(documents, ctx)
            results += deleted
            problems += found
        applied = not problems and not dry_run
        if not applied:
            transaction.set_rollback(True)
    return Outcome(results, problems, applied)


def _apply_one(doc: Document, ctx: Context) -> tuple[dict[str, Any] | None, list[Problem]]:
    kind = KINDS[doc.kind]
    try:
        with transaction.atomic():
            obj = kind.find(doc.name)
            prepared = kind.prepare(obj, doc.name, doc.spec, ctx)
            prepared.run()
    except Exception as exc:
        fields = _refusal(exc)
        if fields is None:
            raise
        return None, [doc.problem(where, " ".join(messages)) for where, messages in fields.items()]
    action = "created" if obj is None else ("changed" if prepared.changes else "unchanged")
    return {"source": doc.source, "index": doc.index, "kind": doc.kind, "name": doc.name, "action": action,
            "changes": prepared.changes}, []  # fmt: skip


def _refusal(exc: Exception) -> dict[str, list[str]] | None:
    """A refusal by a serializer, an action or the database, by the document's field; None for
    anything else (a fault, which is not the document's)."""
    if isinstance(exc, Invalid):
        return exc.fields
    if isinstance(exc, ActionError):
        return action_error(exc).fields
    if isinstance(exc, DRFValidationError):
        return spec_errors(exc.detail)
    if isinstance(exc, DjangoValidationError):
        return spec_errors(exc.message_dict if hasattr(exc, "error_dict") else exc.messages)
    if isinstance(exc, IntegrityError):
        return {"spec": [f"The database refused it: {str(exc).splitlines()[0]}"]}
    return None


def _prune(documents: list[Document], ctx: Context) -> tuple[list[dict[str, Any]], list[Problem]]:
    """Delete the objects of the named kinds that no document names, last dependent first."""
    named: dict[str, set[str]] = {}
    for doc in documents:
        named.setdefault(doc.kind, set()).add(doc.name)
    results: list[dict[str, Any]] = []
    problems: list[Problem] = []
    for kind_name in reversed(list(KINDS)):
        if kind_name not in named:
            continue
        kind = KINDS[kind_name]
        for obj in list(kind.objects()):
            name = kind.name_of(obj)
            if name in named[kind_name]:
                continue
            try:
                with transaction.atomic():
                    kind.delete(obj, ctx)
            except Exception as exc:
                fields = _refusal(exc)
                if fields is None:
                    raise
                message = " ".join(m for messages in fields.values() for m in messages)
                problems.append(Problem(PRUNE, None, kind_name, name, "", f"cannot be pruned: {message}"))
                continue
            results.append({"source": None, "index": None, "kind": kind_name, "name": name, "action": "deleted",
                            "changes": []})  # fmt: skip
    return results, problems


def export_documents(ctx: Context) -> list[dict[str, Any]]:
    """Today's platform as manifest documents, in the order they apply."""
    out = []
    for kind in KINDS.values():
        for obj in kind.objects():
            out.append({"apiVersion": API_VERSION, "kind": kind.kind, "metadata": {"name": kind.name_of(obj)},
                        "spec": kind.spec_of(obj, ctx)})  # fmt: skip
    return out
