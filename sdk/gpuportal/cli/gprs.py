"""GPU provisioning request commands: `gpuportal gpr create|estimate|ls|show|events|modify|cancel|
release|approve|reject|calendar`.

A request is named on the command line by its id. Durations are words the portal reads (3d, 36h,
90m) or seconds; times are ISO 8601 (2026-12-01T09:00, local time without an offset).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from gpuportal.cli.app import (
    EXIT_USAGE,
    cli,
    examples,
    fail,
    json_option,
    portal,
    print_details,
    print_json,
    print_models,
    workspace_option,
)
from gpuportal.errors import SpecError, ValidationError
from gpuportal.gprs import GPR, OPEN_STATES, describe

GPR_ID = click.argument("ident", metavar="GPR", type=int)
# The API's field (and the SDK's argument) -> the option that gives it, to name a refused field as
# the command line does.
OPTION = {
    "gpu_type": "--type", "gpus": "--gpus", "duration": "--duration", "duration_s": "--duration",
    "start_at": "--start", "start": "--start", "cluster": "--cluster", "priority": "--priority",
    "justification": "--justification", "workspace": "--workspace", "reason": "--reason", "from": "--from",
    "to": "--to", "end": "--to",
}  # fmt: skip


@contextmanager
def _in_option_words() -> Iterator[None]:
    """A refused field named as the option that gave it (--duration, not duration_s)."""
    try:
        yield
    except ValidationError as exc:
        fields = {OPTION.get(k, k): v for k, v in exc.fields.items()}
        raise ValidationError(exc.message, status=exc.status, code=exc.code, fields=fields) from None
    except SpecError as exc:
        raise SpecError(exc.reason, field=OPTION.get(exc.field or "", exc.field)) from None


def _terms(func: Any) -> Any:
    """The options of a request's terms, shared by create and estimate."""
    options = [
        workspace_option,
        click.option("-t", "--type", "gpu_type", required=True, help="The GPU type (h100, a100-80gb...)."),
        click.option("-g", "--gpus", type=int, required=True, help="How many whole GPUs, all in one cluster."),
        click.option("-d", "--duration", required=True, help="For how long: 3d, 36h, 90m, or seconds."),
        click.option("--start", help="From when (ISO 8601, local time without an offset; default: as soon as "
                                     "possible)."),
        click.option("--cluster", help="The cluster to hold them on (default: whichever can soonest)."),
        click.option("--priority", type=int, default=0, show_default=True, help="From -100 to 100."),
    ]  # fmt: skip
    for option in reversed(options):
        func = option(func)
    return func


@cli.group(epilog=examples(
    "gpuportal gpr estimate -t h100 -g 4 -d 3d -w demo-team",
    "gpuportal gpr create -t h100 -g 4 -d 3d --start 2026-12-01T09:00 -j 'Fine-tuning for the review' -w demo-team",
    "gpuportal gpr ls",
    "gpuportal gpr calendar",
    "gpuportal gpr release 12",
))  # fmt: skip
def gpr() -> None:
    """GPU provisioning requests: whole GPUs of a type reserved ahead of time for a workspace, from a
    start (or as soon as possible) for a duration. The workspace's policy approves a request at once
    (within its quota and the policy's longest time) or an admin decides. REQUESTED, APPROVED (its
    GPUs held from its start), ACTIVE, ENDED; or REJECTED, CANCELLED, RELEASED (ended early). GPR
    is a request's id."""


@gpr.command("create", epilog=examples(
    "gpuportal gpr create -t h100 -g 2 -d 6h -j 'Ablations for the paper'",
    "gpuportal gpr create -t h100 -g 8 -d 3d --start 2026-12-01T09:00 --cluster local -j 'Pre-training' -w demo-team",
))  # fmt: skip
@_terms
@click.option("-j", "--justification", required=True, help="What the GPUs are for: the admin who decides reads it.")
@click.option("-q", "--quiet", is_flag=True, help="Print only the request's id.")
@json_option
def create_gpr(justification: str, quiet: bool, as_json: bool, **terms: Any) -> None:
    """Ask for GPUs ahead of time. The portal finds the earliest feasible start; the request is
    APPROVED at once where the workspace's policy allows it, else it waits for an admin."""
    with _in_option_words():
        made = portal().gprs.create(justification=justification, **terms)
    if as_json:
        print_json(made.data)
    elif quiet:
        click.echo(made.id)
    else:
        click.echo(describe(made))


@gpr.command("estimate", epilog=examples("gpuportal gpr estimate -t h100 -g 4 -d 2d", "gpuportal gpr estimate -t h100 "
                                         "-g 8 -d 36h --start 2026-12-01T09:00 -w demo-team --json"))  # fmt: skip
@_terms
@json_option
def estimate_gpr(as_json: bool, **terms: Any) -> None:
    """Say what a request with these terms would get, asking nothing: its earliest feasible start,
    the cluster, and whether the workspace's policy would approve it at once (or why not)."""
    with _in_option_words():
        found = portal().gprs.estimate(**terms)
    print_details(found, as_json)


@gpr.command("ls", epilog=examples("gpuportal gpr ls", "gpuportal gpr ls --state REQUESTED   # an admin's queue",
                                   "gpuportal gpr ls -w demo-team --all"))  # fmt: skip
@workspace_option
@click.option("--state", "states", multiple=True, help="Only requests in this state (repeat).")
@click.option("-a", "--all", "show_all", is_flag=True, help="Ended ones too (ENDED, REJECTED, CANCELLED, RELEASED).")
@click.option("-n", "--limit", default=20, show_default=True, help="How many of the newest.")
@json_option
def list_gprs(workspace: str | None, states: tuple[str, ...], show_all: bool, limit: int, as_json: bool) -> None:
    """List requests you can see (every workspace's, for an admin), newest first: those not ended,
    unless --all or --state."""
    wanted = list(states) or (None if show_all else list(OPEN_STATES))
    print_models(portal().gprs.list(workspace, wanted, limit=limit), as_json)


@gpr.command("show", epilog=examples("gpuportal gpr show 12", "gpuportal gpr show 12 --json"))
@GPR_ID
@json_option
def show_gpr(ident: int, as_json: bool) -> None:
    """Show one request: what was asked and why, the earliest feasible start, what it holds and when,
    how many of its GPUs are in use, and the decision."""
    print_details(portal().gprs.get(ident), as_json)


@gpr.command("events", epilog=examples("gpuportal gpr events 12"))
@GPR_ID
@json_option
def gpr_events(ident: int, as_json: bool) -> None:
    """Its timeline, oldest first: asked, approved or rejected, changed, began, warned, idle, ended."""
    print_models(portal().gprs.events(ident), as_json)


@gpr.command("modify", epilog=examples("gpuportal gpr modify 12 --gpus 2", "gpuportal gpr modify 12 --duration 2d",
                                       "gpuportal gpr modify 12 --start 2026-12-02T09:00"))  # fmt: skip
@GPR_ID
@click.option("-g", "--gpus", type=int, help="Another number of GPUs (once approved: fewer only).")
@click.option("-d", "--duration", help="Another duration: 3d, 36h, 90m (once approved, a longer one may wait for an "
                                       "admin).")  # fmt: skip
@click.option("--start", help="Another start (before approval only).")
@json_option
def modify_gpr(ident: int, gpus: int | None, duration: str | None, start: str | None, as_json: bool) -> None:
    """Change a request. Not yet approved: any of its terms, checked again. Approved or active:
    fewer GPUs (the others go back at once), a shorter time, or a longer one."""
    if gpus is None and duration is None and start is None:
        fail("Give --gpus, --duration or --start.", EXIT_USAGE)
    with _in_option_words():
        changed = portal().gprs.modify(ident, gpus=gpus, duration=duration, start=start)
    _show(changed, as_json)


def _show(request: GPR, as_json: bool) -> None:
    if as_json:
        print_json(request.data)
    else:
        click.echo(describe(request))


@gpr.command("cancel", epilog=examples("gpuportal gpr cancel 12", "gpuportal gpr cancel 12 13 --yes"))
@click.argument("idents", metavar="GPR...", type=int, nargs=-1, required=True)
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
def cancel_gpr(idents: tuple[int, ...], yes: bool) -> None:
    """Withdraw requests that have not begun (an active one is released instead)."""
    client = portal()
    for ident in idents:
        if not yes and not click.confirm(f"Cancel GPR {ident}?"):
            fail("Not cancelled.")
        click.echo(describe(client.gprs.cancel(ident)))


@gpr.command("release", epilog=examples("gpuportal gpr release 12 --yes"))
@click.argument("idents", metavar="GPR...", type=int, nargs=-1, required=True)
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
def release_gpr(idents: tuple[int, ...], yes: bool) -> None:
    """End active reservations now: their GPUs go back to everyone at once; work still running there
    goes on under the workspace's quota."""
    client = portal()
    for ident in idents:
        if not yes and not click.confirm(f"Release GPR {ident} now?"):
            fail("Not released.")
        click.echo(describe(client.gprs.release(ident)))


@gpr.command("approve", epilog=examples("gpuportal gpr approve 12",
                                        "gpuportal gpr approve 12 --gpus 2 --duration 1d --reason 'Two for a day.'",
                                        "gpuportal gpr approve 12 --start 2026-12-03T09:00"))  # fmt: skip
@GPR_ID
@click.option("--start", help="A later start than asked (ISO 8601).")
@click.option("-g", "--gpus", type=int, help="Fewer GPUs than asked.")
@click.option("-d", "--duration", help="A shorter time than asked: 1d, 12h...")
@click.option("--reason", default="", help="A word for the requester (mailed with the decision).")
@json_option
def approve_gpr(ident: int, start: str | None, gpus: int | None, duration: str | None, reason: str,
                as_json: bool) -> None:  # fmt: skip
    """Platform admins: approve a pending request, as asked or with a later start, fewer GPUs or a
    shorter time; it holds the earliest GPUs the calendar finds from then on."""
    with _in_option_words():
        approved = portal().gprs.approve(ident, start=start, gpus=gpus, duration=duration, reason=reason)
    _show(approved, as_json)


@gpr.command("reject", epilog=examples("gpuportal gpr reject 12 --reason 'The cluster is booked for the review.'"))
@GPR_ID
@click.option("--reason", required=True, help="Why: the requester reads it.")
@json_option
def reject_gpr(ident: int, reason: str, as_json: bool) -> None:
    """Platform admins: reject a pending request, saying why."""
    with _in_option_words():
        rejected = portal().gprs.reject(ident, reason)
    _show(rejected, as_json)


@gpr.command("calendar", epilog=examples("gpuportal gpr calendar",
                                         "gpuportal gpr calendar --from 2026-12-01 --to 2026-12-31"))  # fmt: skip
@click.option("--from", "start", help="The window's start (ISO 8601; default: now).")
@click.option("--to", "end", help="The window's end (default: 14 days after its start).")
@json_option
def gpr_calendar(start: str | None, end: str | None, as_json: bool) -> None:
    """Every reservation (approved or active) in the window, whichever workspace holds it: who,
    how many GPUs of which type, where, and when."""
    with _in_option_words():
        found = portal().gprs.calendar(start, end)
    print_models(found, as_json)
