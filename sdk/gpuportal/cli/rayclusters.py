"""Ray cluster commands: `gpuportal clusters create|ls|show|wait|delete`, and what `submit`,
`wait`, `status`, `logs`, `cancel` and `artifacts` do with a Ray job (a cluster with an entrypoint).

A Ray job's id works wherever a job's does: workload ids are one sequence, so the job commands
look an id up as a job first and as a Ray cluster next.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from gpuportal.cli.app import (
    EXIT_CANCELLED,
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
from gpuportal.errors import SpecError
from gpuportal.rayclusters import RayCluster, describe, exit_code_of
from gpuportal.rayspec import RayClusterSpec

# Options of `submit` that only a job has: a Ray spec sizes its head and workers instead.
JOB_ONLY = {"gpus": "--gpus", "replicas": "--replicas"}


def parse_env(pairs: tuple[str, ...]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SpecError(f"{pair!r}: write NAME=VALUE", field="env")
        env[name] = value
    return env


def cluster_progress() -> Progress:
    return Progress(describe, lambda cluster: describe(cluster, timer=False))


def follow_cluster(
    client: Client, cluster: RayCluster, *, logs: bool, timeout: float | None, as_json: bool
) -> NoReturn:
    """Wait for a Ray job's end with a progress display (and its log), then exit with its code: 0,
    its entrypoint's own, 1 for a failure without one, 130 if stopped; 124 after `timeout`."""
    progress = cluster_progress()

    def write(text: str) -> None:
        progress.pause()
        sys.stdout.write(text)
        sys.stdout.flush()

    if logs:
        progress.live = False  # state changes as lines between the log's
    try:
        cluster = client.ray_clusters.wait(cluster.id, timeout, on_update=progress, logs=write if logs else None)
    except KeyboardInterrupt:
        progress.close()
        fail(f"Stopped waiting; Ray cluster {cluster.id} goes on (`gpuportal cancel {cluster.id}` stops it).",
             EXIT_CANCELLED)  # fmt: skip
    finally:
        progress.close()
    if as_json:
        print_json(cluster.data)
    raise click.exceptions.Exit(exit_code_of(cluster))


def submit_ray_spec(
    spec: Path,
    overrides: dict[str, Any],
    env_pairs: tuple[str, ...],
    artifacts: tuple[str, ...],
    *,
    wait: bool,
    logs: bool,
    timeout: float | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """`gpuportal submit` of a spec with ``kind: ray``: a Ray job, fire and forget like a job."""
    for key, option in JOB_ONLY.items():
        if overrides.get(key) is not None:
            raise SpecError(f"{option} is a job's; a Ray spec sets head_gpus, worker_gpus and workers", field=key)
    fields = {k: v for k, v in overrides.items() if k not in JOB_ONLY}
    fields["entrypoint"] = fields.pop("command", None)
    request = RayClusterSpec.load(spec, **fields)
    if not request.entrypoint.strip():
        raise SpecError(
            "a Ray job needs an entrypoint (or a script); for a cluster without one, use `gpuportal clusters create`",
            field="entrypoint",
            source=str(spec),
        )
    request.env.update(parse_env(env_pairs))
    request.artifacts.extend(a for a in artifacts if a not in request.artifacts)
    client = portal()
    cluster = client.ray_clusters.create(request)
    if as_json and not wait:
        print_json(cluster.data)
    elif quiet:
        click.echo(cluster.id)
    else:
        click.echo(
            f"Submitted Ray job {cluster.id} ({cluster.name}) to workspace {cluster.workspace}: a head and "
            f"{cluster.workers} worker{'s' if cluster.workers != 1 else ''}.",
            err=wait,
        )
    if wait:
        follow_cluster(client, cluster, logs=logs, timeout=timeout, as_json=as_json)


@cli.group(epilog=examples(
    "gpuportal clusters create tune --workers 2 --worker-gpus 1 --worker-memory 16 --wait",
    "gpuportal clusters ls",
    "gpuportal clusters show 7",
    "gpuportal clusters delete 7 --yes",
))  # fmt: skip
def clusters() -> None:
    """Ray clusters: a head and workers, admitted together under the workspace's quota (QUEUED
    until all fit), then RUNNING with a dashboard. A preempted cluster goes back in the queue and
    runs again. With --entrypoint it is a Ray job, which ends with its entrypoint: `gpuportal wait`,
    `logs`, `artifacts` and `cancel` take its id as they take a job's."""


@clusters.command("ls", epilog=examples("gpuportal clusters ls", "gpuportal clusters ls -w demo-team --state RUNNING"))
@workspace_option
@click.option("--state", "states", multiple=True, help="Only clusters in this state (repeat).")
@click.option("-n", "--limit", default=20, show_default=True, help="How many of the newest clusters.")
@json_option
def list_clusters(workspace: str | None, states: tuple[str, ...], limit: int, as_json: bool) -> None:
    """List Ray clusters, newest first."""
    print_models(portal().ray_clusters.list(workspace, list(states) or None, limit=limit), as_json)


@clusters.command("create", epilog=examples(
    "gpuportal clusters create dev                           # a head and one worker, the portal's sizes",
    "gpuportal clusters create tune --workers 4 --worker-gpus 1 --worker-cpus 4 --worker-memory 16 --wait",
    "gpuportal clusters create big --profile gpu-1 --workers 2 --head-cpus 2 -w demo-team",
    "gpuportal clusters create sweep --workers 2 --worker-gpus 1 --entrypoint 'python sweep.py' -a results",
))  # fmt: skip
@click.argument("name")
@workspace_option
@click.option("--workers", type=int, help="Number of workers (0: a head alone). Default 1.")
@click.option("--worker-gpus", help="GPUs per worker: 1, 8, or 0.5 for a share of one.")
@click.option("--worker-cpus", help="CPU cores per worker (whole cores).")
@click.option("--worker-memory", help="Memory per worker in GB (or 16G, 512Mi).")
@click.option("--head-gpus", help="GPUs of the head.")
@click.option("--head-cpus", help="CPU cores of the head (at least 1: it runs Ray's own services).")
@click.option("--head-memory", help="Memory of the head in GB (or 8G).")
@click.option("--profile", "--worker-profile", "worker_profile", help="Size each worker as this compute profile.")
@click.option("--head-profile", help="Size the head as this compute profile.")
@click.option("--gpu-type", help="GPU type (default: the workspace's only type, or the profile's).")
@click.option("--entrypoint", help="Shell command to run once every node joined; the cluster ends with it.")
@click.option("--image", help="Container image, where the cluster runs images.")
@click.option("-e", "--env", "env_pairs", multiple=True, metavar="NAME=VALUE", help="Environment variable (repeat).")
@click.option("-a", "--artifact", "artifacts", multiple=True, help="Path to keep as an artifact (repeat).")
@click.option("--max-runtime", help="Runtime limit: seconds, or 30m, 2h, 1d.")
@click.option("--priority", type=int, help="Priority within the workspace (-1000 to 1000).")
@click.option("--cluster", help="The portal cluster it must run on (default: any).")
@click.option("--description", help="What it is for.")
@click.option("--wait", "wait_", is_flag=True, help="Wait until it is RUNNING, and print its dashboard URL.")
@click.option("--timeout", type=float, help="With --wait: give up after this many seconds (exit 124).")
@click.option("-q", "--quiet", is_flag=True, help="Print only the cluster's id.")
@json_option
def create_cluster(
    name: str,
    env_pairs: tuple[str, ...],
    artifacts: tuple[str, ...],
    wait_: bool,
    timeout: float | None,
    quiet: bool,
    as_json: bool,
    **options: Any,
) -> None:
    """Request a Ray cluster: a head and --workers workers, each of the size given (or a compute
    profile's). It is QUEUED until all its nodes can be admitted together."""
    request = RayClusterSpec.load(
        None,
        name=name,
        env=parse_env(env_pairs) or None,
        artifacts=list(artifacts) or None,
        **{k: v for k, v in options.items() if v is not None},
    )
    client = portal()
    cluster = client.ray_clusters.create(request)
    if quiet:
        click.echo(cluster.id)
    else:
        click.echo(f"Requested Ray cluster {cluster.id} ({cluster.name}) in workspace {cluster.workspace}.", err=True)
    if wait_:
        cluster = wait_ready(client, cluster.id, timeout)
    if as_json:
        print_json(cluster.data)
    elif not quiet:
        click.echo(cluster.dashboard_url if wait_ and cluster.dashboard_url else describe(cluster))


def wait_ready(client: Client, cluster_id: int, timeout: float | None) -> RayCluster:
    progress = cluster_progress()
    try:
        return client.ray_clusters.wait_ready(cluster_id, timeout=timeout, on_update=progress)
    except KeyboardInterrupt:
        progress.close()
        fail(f"Stopped waiting; Ray cluster {cluster_id} goes on.", EXIT_CANCELLED)
    finally:
        progress.close()


@clusters.command("show", epilog=examples("gpuportal clusters show 7", "gpuportal clusters show 7 --json"))
@click.argument("cluster_id", metavar="CLUSTER", type=int)
@json_option
def show_cluster(cluster_id: int, as_json: bool) -> None:
    """Show one Ray cluster: sizes, state (queue position and reason while it waits), nodes,
    dashboard URL while it runs, exit code and artifacts once it ended."""
    print_details(portal().ray_clusters.get(cluster_id), as_json)


@clusters.command("wait", epilog=examples("gpuportal clusters wait 7 --timeout 600"))
@click.argument("cluster_id", metavar="CLUSTER", type=int)
@click.option("--timeout", type=float, help="Give up after this many seconds (exit 124; it goes on).")
def wait_cluster(cluster_id: int, timeout: float | None) -> None:
    """Wait until a Ray cluster is RUNNING and print its dashboard URL (exit 1 if it fails or is
    deleted instead). To wait for a Ray job's end, use `gpuportal wait`."""
    cluster = wait_ready(portal(), cluster_id, timeout)
    click.echo(cluster.dashboard_url or describe(cluster))


@clusters.command("delete", epilog=examples("gpuportal clusters delete 7", "gpuportal clusters delete 7 8 --yes"))
@click.argument("cluster_ids", metavar="CLUSTER...", type=int, nargs=-1, required=True)
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
def delete_cluster(cluster_ids: tuple[int, ...], yes: bool) -> None:
    """Stop Ray clusters and the Ray jobs on them; their records stay, STOPPED."""
    client = portal()
    for cluster_id in cluster_ids:
        cluster = client.ray_clusters.get(cluster_id)
        if not yes and not click.confirm(f"Stop Ray cluster {cluster.id} ({cluster.name}, {cluster.state})?"):
            fail("Not stopped.")
        click.echo(describe(client.ray_clusters.delete(cluster_id), timer=False))
