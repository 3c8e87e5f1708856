"""Inference endpoint commands: `gpuportal endpoints ls|show|create|scale|update|delete|wait|events|
metrics|logs|token|profiles`.

An endpoint is named on the command line by its id or by its name (the live endpoint of that name
in the workspace -w names, by default the configured one, else yours).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from gpuportal.cli.app import (
    EXIT_CANCELLED,
    EXIT_USAGE,
    Progress,
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
from gpuportal.client import Client
from gpuportal.endpoints import Endpoint, describe
from gpuportal.errors import SpecError, ValidationError
from gpuportal.spec import parse_duration

ENDPOINT = click.argument("ident", metavar="ENDPOINT")
# The API's field -> the option that gives it, to name a refused field as the command line does.
OPTION = {
    "min_replicas": "--min", "max_replicas": "--max", "scale_to_zero_s": "--scale-to-zero", "path": "--path",
    "source_job": "--from-job", "artifact": "--artifact", "profile": "--profile", "workspace": "--workspace",
    "description": "--description", "cluster": "--cluster", "replica": "--replica",
}  # fmt: skip
NEVER = ("never", "off", "none")


def _delay(value: int | str | None) -> int | None:
    """A --scale-to-zero given to create: None for never."""
    return value if isinstance(value, int) else None


def _parse_delay(ctx: click.Context, param: click.Parameter, value: str | None) -> int | str | None:
    """--scale-to-zero: seconds, a duration (10m, 1h), or "never"; None where not given."""
    if value is None:
        return None
    if value.strip().lower() in NEVER:
        return "never"
    try:
        return parse_duration(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not seconds, a duration such as 10m or 1h, or 'never'.") from None


@contextmanager
def _in_option_words() -> Iterator[None]:
    """A refused field named as the option that gave it (--min, not min_replicas)."""
    try:
        yield
    except ValidationError as exc:
        fields = {OPTION.get(k, k): v for k, v in exc.fields.items()}
        raise ValidationError(exc.message, status=exc.status, code=exc.code, fields=fields) from None
    except SpecError as exc:
        raise SpecError(exc.reason, field=OPTION.get(exc.field or "", exc.field)) from None


def _get(client: Client, ident: str, workspace: str | None) -> Endpoint:
    return client.endpoints.get(ident, workspace)


def _wait_ready(client: Client, endpoint: Endpoint, timeout: float | None, *, version: int | None = None) -> Endpoint:
    progress = Progress(describe, describe)
    try:
        return client.endpoints.wait_ready(endpoint.id, timeout=timeout, on_update=progress, version=version)
    except KeyboardInterrupt:
        progress.close()
        fail(f"Stopped waiting; endpoint {endpoint.id} goes on.", EXIT_CANCELLED)
    finally:
        progress.close()


def _bounds(endpoint: Endpoint) -> str:
    to_zero = (
        f", to zero after {endpoint.scale_to_zero_s} s without requests" if endpoint.scale_to_zero_s is not None else ""
    )
    return f"{endpoint.min_replicas} to {endpoint.max_replicas} replicas{to_zero}"


def _model(path: str | None, job: int | None, artifact: str | None) -> dict[str, Any]:
    """The SDK's keywords for the model options; a usage error for a wrong combination."""
    if path is not None and (job is not None or artifact is not None):
        fail("Give --path, or --from-job with --artifact, not both.", EXIT_USAGE)
    if job is not None and not artifact:
        fail(f"--artifact: name the artifact of job {job} to serve (a file, or a directory: model/).", EXIT_USAGE)
    if artifact is not None and job is None:
        fail("--artifact: an artifact is a job's: give --from-job too.", EXIT_USAGE)
    return {"path": path, "job": job, "artifact": artifact}


@cli.group(epilog=examples(
    "gpuportal endpoints create chat --from-job 42 --artifact model/ --wait",
    "gpuportal endpoints create chat --path models/tiny.gguf --profile llama-cpu --min 0 --scale-to-zero 10m",
    "gpuportal endpoints ls",
    "gpuportal endpoints scale chat --max 4",
    "TOKEN=$(gpuportal endpoints token chat)",
))  # fmt: skip
def endpoints() -> None:
    """Inference endpoints: a model (a file in the workspace's directory, or a finished job's
    artifact) served at a stable URL, the OpenAI API's base URL, by replicas of an inference
    profile's server between --min and --max, each admitted under the workspace's quota.
    DEPLOYING until a replica serves, then READY; IDLE once scaled to zero (the next request starts
    a replica); FAILED; DELETING, then DELETED. ENDPOINT is an id or a name."""


@endpoints.command("ls", epilog=examples("gpuportal endpoints ls", "gpuportal endpoints ls -w demo-team --state READY"))
@workspace_option
@click.option("--state", "states", multiple=True, help="Only endpoints in this state (repeat).")
@click.option("-a", "--all", "show_all", is_flag=True, help="Ended ones too (FAILED, DELETED).")
@click.option("-n", "--limit", default=20, show_default=True, help="How many of the newest.")
@json_option
def list_endpoints(workspace: str | None, states: tuple[str, ...], show_all: bool, limit: int, as_json: bool) -> None:
    """List endpoints, newest first: those not ended, unless --all or --state."""
    wanted = list(states) or (None if show_all else ["DEPLOYING", "READY", "IDLE", "DELETING"])
    print_models(portal().endpoints.list(workspace, wanted, limit=limit), as_json)


@endpoints.command("show", epilog=examples("gpuportal endpoints show chat", "gpuportal endpoints show 5 --json"))
@ENDPOINT
@workspace_option
@json_option
def show_endpoint(ident: str, workspace: str | None, as_json: bool) -> None:
    """Show one endpoint: its model, profile, version, state (why it failed), URL, bounds, and each
    replica with its state (why it waits, or why it stopped)."""
    print_details(_get(portal(), ident, workspace), as_json)


@endpoints.command("create", epilog=examples(
    "gpuportal endpoints create chat --from-job 42 --artifact model/",
    "gpuportal endpoints create chat --path models/tiny.gguf --profile llama-cpu --wait",
    "gpuportal endpoints create chat --path models/tiny.gguf --min 1 --max 4 -w demo-team",
    "gpuportal endpoints create chat --path models/tiny.gguf --min 0 --max 2 --scale-to-zero 15m",
))  # fmt: skip
@click.argument("name")
@click.option("--path", help="The model: a path in the workspace's directory (a .gguf file, or a model directory).")
@click.option("--from-job", "job", type=int, metavar="JOB", help="Serve an artifact of this finished job...")
@click.option("--artifact", help="... this one: a file the job left, or a directory of them (model/).")
@click.option("-p", "--profile", help="Inference profile (default: the only one you may use; `endpoints profiles`).")
@workspace_option
@click.option("--min", "min_replicas", type=int, help="Fewest replicas (default 1; 0 needs --scale-to-zero).")
@click.option("--max", "max_replicas", type=int, help="Most replicas (default: the minimum, at least 1).")
@click.option(
    "--scale-to-zero",
    "scale_to_zero_s",
    metavar="SECONDS",
    callback=_parse_delay,
    help="Stop every replica after this long without a request: seconds, or 10m, 1h (default never).",
)
@click.option("--cluster", help="The portal cluster its replicas must run on (default: any).")
@click.option("--description", default="", help="What it is for.")
@click.option("--wait", "wait_", is_flag=True, help="Wait until it answers requests, and print its URL.")
@click.option("--timeout", type=float, help="With --wait: give up after this many seconds (exit 124; it goes on).")
@click.option("-q", "--quiet", is_flag=True, help="Print only the endpoint's id.")
@json_option
def create_endpoint(
    name: str,
    path: str | None,
    job: int | None,
    artifact: str | None,
    workspace: str | None,
    wait_: bool,
    timeout: float | None,
    quiet: bool,
    as_json: bool,
    **options: Any,
) -> None:
    """Deploy a model at an endpoint: --path, or --from-job and --artifact. Its minimum replicas
    are queued at once, admitted under the workspace's quota, and serve once their server answers."""
    model = _model(path, job, artifact)
    if path is None and job is None:
        fail("Give the model: --path PATH, or --from-job JOB --artifact PATH.", EXIT_USAGE)
    client = portal()
    options["scale_to_zero_s"] = _delay(options["scale_to_zero_s"])
    with _in_option_words():
        endpoint = client.endpoints.create(name, workspace=workspace, **model, **options)
    if quiet:
        click.echo(endpoint.id)
    else:
        click.echo(f"Deployed endpoint {endpoint.id} ({endpoint.name}) in workspace {endpoint.workspace}: "
                   f"{endpoint.model}, {_bounds(endpoint)}.", err=True)  # fmt: skip
    if wait_:
        endpoint = _wait_ready(client, endpoint, timeout)
    if as_json:
        print_json(endpoint.data)
    elif not quiet:
        click.echo(endpoint.url if wait_ else describe(endpoint))


@endpoints.command("scale", epilog=examples(
    "gpuportal endpoints scale chat --min 2 --max 4",
    "gpuportal endpoints scale chat --min 0 --scale-to-zero 10m",
    "gpuportal endpoints scale chat --min 1 --scale-to-zero never",
))  # fmt: skip
@ENDPOINT
@workspace_option
@click.option("--min", "min_replicas", type=int, help="Fewest replicas (0: it may scale to zero).")
@click.option("--max", "max_replicas", type=int, help="Most replicas.")
@click.option("--scale-to-zero", "scale_to_zero_s", metavar="SECONDS", callback=_parse_delay,
              help="Stop every replica after this long without a request: seconds, 10m, 1h, or never.")  # fmt: skip
@json_option
def scale_endpoint(
    ident: str,
    workspace: str | None,
    min_replicas: int | None,
    max_replicas: int | None,
    scale_to_zero_s: int | str | None,
    as_json: bool,
) -> None:
    """Change how many replicas an endpoint has (what is not given stays as it is); its replicas
    follow at once. A minimum above the maximum is refused."""
    if min_replicas is None and max_replicas is None and scale_to_zero_s is None:
        fail("Give --min, --max or --scale-to-zero.", EXIT_USAGE)
    client = portal()
    endpoint = _get(client, ident, workspace)
    with _in_option_words():
        to_zero = ... if scale_to_zero_s is None else _delay(scale_to_zero_s)
        endpoint = client.endpoints.scale(endpoint, min_replicas, max_replicas, to_zero)
    if as_json:
        print_json(endpoint.data)
        return
    click.echo(f"Endpoint {endpoint.id} {endpoint.name}: {_bounds(endpoint)}.")
    click.echo(describe(endpoint))


@endpoints.command("update", epilog=examples(
    "gpuportal endpoints update chat --from-job 43 --artifact model/ --wait",
    "gpuportal endpoints update chat --path models/v2.gguf",
    "gpuportal endpoints update chat --profile llama-cpu-large",
    "gpuportal endpoints update chat --description 'support bot, v2'",
))  # fmt: skip
@ENDPOINT
@workspace_option
@click.option("--path", help="Serve this model instead: a path in the workspace's directory.")
@click.option("--from-job", "job", type=int, metavar="JOB", help="Serve an artifact of this finished job instead...")
@click.option("--artifact", help="... this one (a file, or a directory of them: model/).")
@click.option("-p", "--profile", help="Serve it with this inference profile.")
@click.option("--description", help="What it is for.")
@click.option("--wait", "wait_", is_flag=True, help="Wait until the new version serves, and print the URL.")
@click.option("--timeout", type=float, help="With --wait: give up after this many seconds (exit 124; it goes on).")
@json_option
def update_endpoint(
    ident: str,
    workspace: str | None,
    path: str | None,
    job: int | None,
    artifact: str | None,
    profile: str | None,
    description: str | None,
    wait_: bool,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Serve another model, or the same with another profile: a new version, rolled out without a
    failed request (its replicas serve before the old ones stop). If they cannot start, the
    endpoint goes back to what served before and says why; --wait then exits 1."""
    model = _model(path, job, artifact)
    if path is None and job is None and profile is None and description is None:
        fail("Give --path, --from-job with --artifact, --profile or --description.", EXIT_USAGE)
    client = portal()
    endpoint = _get(client, ident, workspace)
    with _in_option_words():
        endpoint = client.endpoints.update(endpoint, **model, profile=profile, description=description)
    if not as_json:
        click.echo(f"Endpoint {endpoint.id} {endpoint.name}: version {endpoint.version}, {endpoint.model} "
                   f"({endpoint.profile}).", err=wait_)  # fmt: skip
    if wait_:
        endpoint = _wait_ready(client, endpoint, timeout, version=endpoint.version)
    if as_json:
        print_json(endpoint.data)
    else:
        click.echo(endpoint.url if wait_ else describe(endpoint))


@endpoints.command("wait", epilog=examples("gpuportal endpoints wait chat --timeout 600"))
@ENDPOINT
@workspace_option
@click.option("--timeout", type=float, help="Give up after this many seconds (exit 124; it goes on).")
def wait_endpoint(ident: str, workspace: str | None, timeout: float | None) -> None:
    """Wait until an endpoint answers requests (a replica of its current version serves, or it has
    scaled to zero), then print its URL; exit 1 if it fails or is deleted instead."""
    client = portal()
    endpoint = _wait_ready(client, _get(client, ident, workspace), timeout)
    click.echo(endpoint.url)


@endpoints.command("delete", epilog=examples("gpuportal endpoints delete chat", "gpuportal endpoints delete 5 6 --yes"))
@click.argument("idents", metavar="ENDPOINT...", nargs=-1, required=True)
@workspace_option
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
def delete_endpoint(idents: tuple[str, ...], workspace: str | None, yes: bool) -> None:
    """Delete endpoints: their replicas stop and their URLs answer 404 from then on."""
    client = portal()
    for ident in idents:
        endpoint = _get(client, ident, workspace)
        if not yes and not click.confirm(f"Delete endpoint {endpoint.id} ({endpoint.name}, {endpoint.state})?"):
            fail("Not deleted.")
        click.echo(describe(client.endpoints.delete(endpoint)))


@endpoints.command("events", epilog=examples("gpuportal endpoints events chat", "gpuportal endpoints events 5 -n 50"))
@ENDPOINT
@workspace_option
@click.option("-n", "--limit", default=20, show_default=True, help="How many of the newest.")
@json_option
def endpoint_events(ident: str, workspace: str | None, limit: int, as_json: bool) -> None:
    """Its scaling decisions, newest first, each with its reason."""
    client = portal()
    print_models(client.endpoints.events(_get(client, ident, workspace))[:limit], as_json)


@endpoints.command("metrics", epilog=examples("gpuportal endpoints metrics chat -n 10"))
@ENDPOINT
@workspace_option
@click.option("-n", "--limit", default=20, show_default=True, help="How many of the latest samples.")
@json_option
def endpoint_metrics(ident: str, workspace: str | None, limit: int, as_json: bool) -> None:
    """Its figures over time, oldest first: replicas, requests waiting, requests and errors per
    second, p50 and p95 latency, tokens per second."""
    client = portal()
    samples = client.endpoints.metrics(_get(client, ident, workspace))
    print_models(samples[-limit:] if limit > 0 else samples, as_json)


@endpoints.command("logs", epilog=examples(
    "gpuportal endpoints logs chat",
    "gpuportal endpoints logs chat -f",
    "gpuportal endpoints logs chat --replica 17   # a replica's id: see `endpoints show`",
))  # fmt: skip
@ENDPOINT
@workspace_option
@click.option("-r", "--replica", type=int, metavar="ID", help="Which replica, by id (default: the newest).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing as the log grows, until the replica ends.")
def endpoint_logs(ident: str, workspace: str | None, replica: int | None, follow: bool) -> None:
    """Print a replica's server log (its start, and why it stopped)."""
    client = portal()
    endpoint = _get(client, ident, workspace)
    try:
        with _in_option_words():
            for text in client.endpoints.stream_logs(endpoint, replica, follow=follow):
                sys.stdout.write(text)
                sys.stdout.flush()
    except KeyboardInterrupt:
        raise click.exceptions.Exit(EXIT_CANCELLED) from None


@endpoints.command("token", epilog=examples(
    "gpuportal endpoints token chat",
    "TOKEN=$(gpuportal endpoints token chat --name support-bot --expires-in-days 30)",
))  # fmt: skip
@ENDPOINT
@workspace_option
@click.option("--name", help="What the token is for (default: the endpoint it calls).")
@click.option("--expires-in-days", type=click.IntRange(1, 365), help="Its lifetime (default: the portal's).")
def endpoint_token(ident: str, workspace: str | None, name: str | None, expires_in_days: int | None) -> None:
    """Make a token that calls this endpoint alone (not the portal's API, nor another endpoint) and
    print it: it is shown only this once. Send it as `Authorization: Bearer <token>` (an OpenAI
    client's api_key); the portal's tokens page lists and revokes it."""
    client = portal()
    endpoint = _get(client, ident, workspace)
    text = client.endpoints.token(endpoint, name=name, expires_in_days=expires_in_days)
    click.echo(f"A token for endpoint {endpoint.name} at {endpoint.url} (shown only this once):", err=True)
    click.echo(text)


@endpoints.command("profiles", epilog=examples("gpuportal endpoints profiles", "gpuportal endpoints profiles --json"))
@json_option
def inference_profiles(as_json: bool) -> None:
    """List the inference profiles your endpoints may use: server and one replica's size."""
    print_models(portal().profiles.inference(), as_json)
