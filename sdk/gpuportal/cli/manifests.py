"""The platform as code: `gpuportal apply -f FILE|DIR`, `gpuportal diff -f ...` and `gpuportal export`
(platform admins; docs/manifests.md).

Documents are read here (YAML, several to a file, every *.yaml, *.yml and *.json of a folder in
name order) and sent with their file and position, so that the portal's refusals name both. A
webhook's secret is never written in a document: ``webhook_secret_from: {env: NAME}`` is read from
this process's environment and sent as ``webhook_secret``.

Exit codes: `apply` 0 when applied (or nothing to change), 1 on any error (nothing is applied);
`diff` 0 without differences, 1 with differences, 2 on an error (as `kubectl diff`); `export` 0, or
1 on an error.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import click
import yaml

from gpuportal.cli.app import EXIT_ERROR, cli, examples, portal, print_json
from gpuportal.errors import GPUPortalError, ValidationError

SUFFIXES = (".yaml", ".yml", ".json")
EXIT_DIFFERENT = 1
EXIT_DIFF_ERROR = 2
SYMBOL = {"created": "+", "changed": "~", "deleted": "-", "unchanged": "="}


class ManifestError(Exception):
    """A file that cannot be read as manifests, or a document this side refuses; ``lines`` says where."""

    def __init__(self, lines: list[str]):
        super().__init__("; ".join(lines))
        self.lines = lines


def files_of(paths: tuple[str, ...]) -> list[Path]:
    """The files the -f options name: a file as it is, a folder's manifest files (recursively, by name)."""
    found: list[Path] = []
    for text in paths:
        path = Path(text)
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
        elif path.is_file() or text == "-":
            found.append(path)
        else:
            raise ManifestError([f"{text}: no such file or folder."])
    return found


def read_documents(paths: tuple[str, ...]) -> list[dict[str, Any]]:
    """Every document of the files, as the API takes them: ``{"source", "index", "manifest"}``."""
    documents: list[dict[str, Any]] = []
    problems: list[str] = []
    for path in files_of(paths):
        source = "(stdin)" if str(path) == "-" else str(path)
        try:
            text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            problems.append(f"{source}: not text (UTF-8).")
            continue
        try:
            loaded = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f", line {mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc)
            problems.append(f"{source}{where}: not YAML: {problem}")
            continue
        for index, manifest in enumerate(loaded, start=1):
            if manifest is None:  # an empty document: a leading or trailing ---
                continue
            # YAML's dates and times (an unquoted 2026-12-01) travel as the text they were written as.
            manifest = json.loads(json.dumps(manifest, default=str))
            try:
                manifest = with_secrets(manifest)
            except ManifestError as exc:
                problems += [f"{source}, document {index}{line}" for line in exc.lines]
                continue
            documents.append({"source": source, "index": index, "manifest": manifest})
    if problems:
        raise ManifestError(problems)
    if not documents:
        raise ManifestError([f"No documents in {', '.join(paths)}."])
    return documents


def with_secrets(manifest: Any) -> Any:
    """The document with a webhook's secret read from the environment variable it names; a secret
    written in the document itself is refused."""
    if (
        not isinstance(manifest, dict)
        or manifest.get("kind") != "AlertRule"
        or not isinstance(manifest.get("spec"), dict)
    ):
        return manifest
    spec = dict(manifest["spec"])
    name = (manifest.get("metadata") or {}).get("name", "") if isinstance(manifest.get("metadata"), dict) else ""
    where = f" (AlertRule {name}): " if name else ": "
    if "webhook_secret" in spec:
        raise ManifestError([f"{where}spec.webhook_secret: a secret is never written in a manifest: "
                             "give webhook_secret_from: {env: VARIABLE} and set that variable."])  # fmt: skip
    source = spec.pop("webhook_secret_from", None)
    if source is None:
        return manifest
    variable = source.get("env") if isinstance(source, dict) else None
    if not isinstance(variable, str) or not variable:
        raise ManifestError([f"{where}spec.webhook_secret_from: expected {{env: VARIABLE}}."])
    if variable not in os.environ:
        raise ManifestError([f"{where}spec.webhook_secret_from: the environment variable {variable} is not set."])
    spec["webhook_secret"] = os.environ[variable]
    return {**manifest, "spec": spec}


def show_value(value: Any) -> str:
    """A value on one line, as JSON writes it ("(none)" for none)."""
    return "(none)" if value is None else json.dumps(value, ensure_ascii=False)


def print_plan(answer: dict[str, Any], *, unchanged: bool) -> None:
    for doc in answer["documents"]:
        if doc["action"] == "unchanged" and not unchanged:
            continue
        click.echo(f"{SYMBOL[doc['action']]} {doc['kind']} {doc['name']}: {doc['action']}")
        if doc["action"] == "changed":
            for change in doc["changes"]:
                click.echo(f"    {change['field']}: {show_value(change['from'])} -> {show_value(change['to'])}")
    summary = answer["summary"]
    counts = ", ".join(f"{summary[k]} {k}" for k in ("created", "changed", "deleted", "unchanged"))
    verb = "would be" if answer["dry_run"] else ("applied" if answer["applied"] else "not applied")
    click.echo(f"{counts} ({verb})." if answer["dry_run"] else f"{counts}: {verb}.")


def refused(exc: GPUPortalError, code: int) -> NoReturn:
    """The portal's refusal, one line per document it refused, and the exit code."""
    lines = exc.fields.get("documents") if isinstance(exc, ValidationError) else None
    for line in lines or [exc.message]:
        click.echo(f"Error: {line}", err=True)
    if lines:
        click.echo("Nothing was applied.", err=True)
    raise click.exceptions.Exit(code)


def unreadable(exc: ManifestError | OSError, code: int) -> NoReturn:
    lines = exc.lines if isinstance(exc, ManifestError) else [f"{exc.filename}: {exc.strerror or exc}"]
    for line in lines:
        click.echo(f"Error: {line}", err=True)
    raise click.exceptions.Exit(code)


def files_option(func: Any) -> Any:
    return click.option(
        "-f",
        "--filename",
        "paths",
        multiple=True,
        required=True,
        help="A manifest file, a folder of them, or - for standard input; may be repeated.",
    )(func)


def prune_option(func: Any) -> Any:
    return click.option(
        "--prune", is_flag=True, help="Also delete the objects of the kinds the documents name that no document names."
    )(func)


@cli.command(epilog=examples(
    "gpuportal apply -f platform/",
    "gpuportal apply -f platform/ --prune --dry-run",
    "gpuportal apply -f profiles.yaml -f workspaces.yaml",
))  # fmt: skip
@files_option
@prune_option
@click.option("--dry-run", is_flag=True, help="Show what would change; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the portal's plan as JSON.")
def apply(paths: tuple[str, ...], prune: bool, dry_run: bool, as_json: bool) -> None:
    """Apply manifests (platform admins): create, change and, with --prune, delete what they say, in
    one transaction; nothing is applied if any document is refused."""
    _send(paths, prune=prune, dry_run=dry_run, as_json=as_json, failed=EXIT_ERROR)


def _send(paths: tuple[str, ...], *, prune: bool, dry_run: bool, as_json: bool, failed: int) -> dict[str, Any]:
    """Read the files, send their documents, print the plan; exit with `failed` when a file cannot be
    read or the portal refuses a document."""
    try:
        documents = read_documents(paths)
    except (ManifestError, OSError) as exc:
        unreadable(exc, failed)
    try:
        answer: dict[str, Any] = portal().apply_manifests(documents, dry_run=dry_run, prune=prune)
    except GPUPortalError as exc:
        refused(exc, failed)
    if as_json:
        print_json(answer)
    else:
        print_plan(answer, unchanged=False)
    return answer


@cli.command(epilog=examples("gpuportal diff -f platform/", "gpuportal diff -f platform/ --prune"))  # fmt: skip
@files_option
@prune_option
@click.option("--json", "as_json", is_flag=True, help="Print the portal's plan as JSON.")
def diff(paths: tuple[str, ...], prune: bool, as_json: bool) -> None:
    """What applying the manifests would change, field by field; writes nothing. Exit code 0: no
    differences, 1: differences, 2: an error."""
    answer = _send(paths, prune=prune, dry_run=True, as_json=as_json, failed=EXIT_DIFF_ERROR)
    if any(doc["action"] != "unchanged" for doc in answer["documents"]):
        raise click.exceptions.Exit(EXIT_DIFFERENT)


@cli.command(epilog=examples("gpuportal export > platform.yaml", "gpuportal export -o platform/all.yaml"))  # fmt: skip
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="Write to this file.")
def export(output: str | None) -> None:
    """Today's platform as manifests (platform admins): apply them to an empty portal to make it again."""
    items = portal().export_manifests()
    text = yaml.safe_dump_all(items, sort_keys=False, default_flow_style=False, explicit_start=True)
    if output:
        Path(output).write_text(text, encoding="utf-8")
        click.echo(f"Wrote {len(items)} documents to {output}.", err=True)
    else:
        click.echo(text, nl=False)
