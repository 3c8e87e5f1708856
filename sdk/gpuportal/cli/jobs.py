"""Job commands: submit, ls, queue, status, logs, wait, cancel, artifacts. `ls --kind` and `queue`
list every kind of workload (client.workloads), with its kind.

A Ray job (a spec with ``kind: ray``: a Ray cluster with an entrypoint) is submitted and followed
with the same commands: its id is looked up as a job's first, then as a Ray cluster's
(gpuportal/cli/rayclusters.py).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from gpuportal.cli.app import (
    EXIT_CANCELLED,
    EXIT_USAGE,
    cli,
    examples,
    fail,
    job_exit_code,
    job_line,
    job_progress,
    json_option,
    portal,
    print_details,
    print_json,
    print_models,
    print_table,
    workspace_option,
)
from gpuportal.cli.rayclusters import follow_cluster, parse_env, submit_ray_spec
from gpuportal.client import Client
from gpuportal.errors import NotFound, SpecError, ValidationError
from gpuportal.models import Job, Model, fmt_estimate
from gpuportal.rayclusters import RayCluster, describe, find_cluster_or
from gpuportal.spec import JobSpec, read_spec_file, spec_kind

JOB_ID = click.argument("job_id", metavar="JOB", type=int)


def _job_or_ray_job(client: Client, job_id: int) -> Job | RayCluster:
    """The job of this id, or else the Ray job (Ray cluster) of this id; the job's NotFound if neither."""
    try:
        return client.jobs.get(job_id)
    except NotFound as missing:
        return find_cluster_or(client, job_id, missing)


@cli.command(epilog=examples(
    "gpuportal submit job.yaml",
    "gpuportal submit job.yaml --wait            # exit code is the job's",
    "gpuportal submit job.yaml --wait --logs     # and print its log as it runs",
    "gpuportal submit --name hello --command 'nvidia-smi' --gpus 1 -w demo-team",
    "gpuportal submit --script train.sh --gpus 2 --replicas 4 -e EPOCHS=10 -a out/",
    "JOB=$(gpuportal submit -q job.yaml) && gpuportal wait $JOB",
    "gpuportal submit ray-job.yaml --wait        # kind: ray: a Ray cluster that runs its entrypoint",
))  # fmt: skip
@click.argument("spec", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--name", help="Job name (default: the spec or script file's name).")
@workspace_option
@click.option("-c", "--command", help="Shell command to run (instead of the spec's).")
@click.option("--script", type=click.Path(dir_okay=False, path_type=Path), help="Bash script to run.")
@click.option("--image", help="Container image, where the cluster runs images.")
@click.option("-e", "--env", "env_pairs", multiple=True, metavar="NAME=VALUE", help="Environment variable (repeat).")
@click.option("--gpus", help="GPUs per replica: 1, 8, or 0.25 for a share of one.")
@click.option("--gpu-type", help="GPU type (default: the workspace's only type).")
@click.option("--replicas", type=int, help="Replicas, started together as a gang.")
@click.option("--priority", type=int, help="Priority within the workspace (-1000 to 1000).")
@click.option("--max-runtime", help="Runtime limit: seconds, or 30m, 2h, 1d.")
@click.option("--cluster", help="The cluster it must run on (default: any).")
@click.option("-a", "--artifact", "artifacts", multiple=True, help="Path to keep as an artifact (repeat).")
@click.option("--wait", "wait_", is_flag=True, help="Follow the job to its end; exit with its code.")
@click.option("--logs", is_flag=True, help="With --wait: print replica 0's log as it runs.")
@click.option("--timeout", type=float, help="With --wait: give up after this many seconds (exit 124).")
@click.option("-q", "--quiet", is_flag=True, help="Print only the job's id.")
@json_option
def submit(
    spec: Path | None,
    env_pairs: tuple[str, ...],
    artifacts: tuple[str, ...],
    wait_: bool,
    logs: bool,
    timeout: float | None,
    quiet: bool,
    as_json: bool,
    **overrides: str | int | Path | None,
) -> None:
    """Submit a job from a YAML spec file, from options, or both (options win).

    The spec sets name, workspace, command or script, env, gpus (per replica), gpu_type,
    replicas, priority, max_runtime and artifacts; see docs/cli.md. A spec with `kind: ray` is a
    Ray job instead: a Ray cluster (head and workers) that runs its entrypoint (--command) and
    ends with it; the same options apply, but --gpus and --replicas.
    """
    if spec is None and not any(overrides.get(k) for k in ("command", "script", "image")):
        fail("Give a job spec file, or --command, --script or --image.", EXIT_USAGE)
    # A path given on the command line is relative to the current folder, not to the spec file.
    paths = {k: str(v.absolute()) for k, v in overrides.items() if isinstance(v, Path)}
    if spec is not None and _kind_of(spec) == "ray":
        submit_ray_spec(spec, {**overrides, **paths}, env_pairs, artifacts, wait=wait_, logs=logs,
                        timeout=timeout, quiet=quiet, as_json=as_json)  # fmt: skip
        return
    job_spec = JobSpec.load(spec, **{**overrides, **paths})
    job_spec.env.update(parse_env(env_pairs))
    job_spec.artifacts.extend(a for a in artifacts if a not in job_spec.artifacts)
    client = portal()
    job = client.jobs.submit(job_spec)
    if as_json and not wait_:
        print_json(job.data)
    elif quiet:
        click.echo(job.id)
    else:
        click.echo(f"Submitted job {job.id} ({job.name}) to workspace {job.workspace}.", err=wait_)
    if wait_:
        _follow(client, job, logs=logs, timeout=timeout, as_json=as_json)


def _kind_of(spec: Path) -> str:
    try:
        return spec_kind(read_spec_file(spec))
    except SpecError as exc:
        raise SpecError(exc.reason, field=exc.field, source=str(spec)) from None


def _follow(client: Client, job: Job, *, logs: bool, timeout: float | None, as_json: bool) -> None:
    """Wait for the job's end with a progress display (or its log), then exit with its code."""
    progress = job_progress()
    try:
        if logs:
            progress.live = False  # state changes as lines between the log's
            progress(job)
            for text in client.jobs.stream_logs(job.id, timeout=timeout):
                sys.stdout.write(text)
                sys.stdout.flush()
        job = client.jobs.wait(job.id, timeout=timeout, on_update=progress)
    except KeyboardInterrupt:
        progress.close()
        fail(f"Stopped waiting; job {job.id} goes on (`gpuportal cancel {job.id}` stops it).", EXIT_CANCELLED)
    finally:
        progress.close()
    if as_json:
        print_json(job.data)
    raise click.exceptions.Exit(job_exit_code(job))


KIND_HELP = "job, instance, notebook, raycluster..."


def _kinds(kinds: tuple[str, ...]) -> list[str] | None:
    """The kinds asked for with --kind, or None for every kind (none asked for, or `all`)."""
    return None if not kinds or "all" in kinds else list(dict.fromkeys(kinds))


@contextmanager
def _kind_refusals() -> Iterator[None]:
    """The portal's refusal of a kind, said of the --kind option that gave it."""
    try:
        yield
    except ValidationError as exc:
        said = exc.fields.get("kind__in") or exc.fields.get("kind")
        if not said:
            raise
        fail(f"--kind: {' '.join(said)}", EXIT_USAGE)


@cli.command("ls", epilog=examples(
    "gpuportal ls",
    "gpuportal ls -w demo-team --state RUNNING --state QUEUED",
    "gpuportal ls --kind all                     # every kind of workload, with a Kind column",
    "gpuportal ls -k raycluster -k instance --state RUNNING",
    "gpuportal ls --json -n 100",
))  # fmt: skip
@workspace_option
@click.option("--state", "states", multiple=True, help="Only those in this state (repeat).")
@click.option("-k", "--kind", "kinds", multiple=True, metavar="KIND",
              help=f"List workloads of this kind instead of jobs ({KIND_HELP}, or all; repeat).")  # fmt: skip
@click.option("-n", "--limit", default=20, show_default=True, help="How many of the newest.")
@json_option
def list_jobs(
    workspace: str | None, states: tuple[str, ...], kinds: tuple[str, ...], limit: int, as_json: bool
) -> None:
    """List jobs, newest first; with --kind, the workloads of those kinds (jobs, instances,
    notebooks, Ray clusters...) in one list, with a Kind column."""
    client = portal()
    if not kinds:
        print_models(client.jobs.list(workspace, list(states) or None, limit=limit), as_json)
        return
    with _kind_refusals():
        listed = client.workloads.list(workspace, kind=_kinds(kinds), state=list(states) or None, limit=limit)
    print_models(listed, as_json)


@cli.command(epilog=examples(
    "gpuportal queue",
    "gpuportal queue -w demo-team --json",
    "gpuportal queue --kind raycluster",
))  # fmt: skip
@workspace_option
@click.option("-k", "--kind", "kinds", multiple=True, metavar="KIND", help=f"Only this kind ({KIND_HELP}; repeat).")
@json_option
def queue(workspace: str | None, kinds: tuple[str, ...], as_json: bool) -> None:
    """Queued workloads of every kind (jobs, instances, Ray clusters...) in the cluster's order:
    position, why each waits, and its estimated start."""
    with _kind_refusals():
        waiting = portal().workloads.queue(workspace, kind=_kinds(kinds))
    if as_json:
        print_json([workload.data for workload in waiting])
        return
    rows = [
        {
            "Pos": str(workload.queue_info.cluster_position or ""),
            "In workspace": str(workload.queue_info.position or ""),
            "ID": str(workload.id),
            "Name": workload.name,
            "Workspace": workload.workspace,
            "GPUs": workload.gpus,
            "Kind": workload.kind,
            "Estimated start": fmt_estimate(workload.queue_info.estimated_start_at),
            "Waiting because": workload.queue_info.reason,
        }
        for workload in waiting
    ]
    print_table(rows)


@cli.command(epilog=examples("gpuportal status 12", "gpuportal status 12 --json"))
@JOB_ID
@json_option
def status(job_id: int, as_json: bool) -> None:
    """Show one job (or Ray job): state, queue position and reason while it waits, exit code once it ended."""
    found: Model = _job_or_ray_job(portal(), job_id)
    print_details(found, as_json)


@cli.command(epilog=examples("gpuportal logs 12", "gpuportal logs -f 12", "gpuportal logs 12 --replica 3"))
@JOB_ID
@click.option("-f", "--follow", is_flag=True, help="Keep printing as the log grows, until the job ends.")
@click.option("-r", "--replica", default=0, show_default=True, help="Which replica of a gang.")
def logs(job_id: int, follow: bool, replica: int) -> None:
    """Print a job's log (stdout and stderr of one replica), or a Ray job's (its nodes' start and
    its entrypoint's output)."""
    client = portal()
    try:
        try:
            _print_all(client.jobs.stream_logs(job_id, replica=replica, follow=follow))
        except NotFound as missing:
            cluster = find_cluster_or(client, job_id, missing)
            if replica:
                fail(f"Ray cluster {cluster.id} has one log: leave out --replica.", EXIT_USAGE)
            _print_all(client.ray_clusters.stream_logs(cluster.id, follow=follow))
    except KeyboardInterrupt:
        raise click.exceptions.Exit(EXIT_CANCELLED) from None


def _print_all(texts: Iterator[str]) -> None:
    for text in texts:
        sys.stdout.write(text)
        sys.stdout.flush()


@cli.command(epilog=examples(
    "gpuportal wait 12",
    "gpuportal wait 12 --timeout 3600 || echo 'failed or still running'",
))  # fmt: skip
@JOB_ID
@click.option("--timeout", type=float, help="Give up after this many seconds (exit 124; the job goes on).")
@click.option("--logs", is_flag=True, help="Print replica 0's log while waiting.")
@json_option
def wait(job_id: int, timeout: float | None, logs: bool, as_json: bool) -> None:
    """Wait for a job (or Ray job) to end, showing its queue position, then its running time. The
    exit code is the job's: 0 on success, its own code on failure, 130 if cancelled (a Ray job:
    stopped), 124 on a timeout."""
    client = portal()
    found = _job_or_ray_job(client, job_id)
    if isinstance(found, RayCluster):
        follow_cluster(client, found, logs=logs, timeout=timeout, as_json=as_json)
    _follow(client, found, logs=logs, timeout=timeout, as_json=as_json)


@cli.command(epilog=examples("gpuportal cancel 12", "gpuportal cancel 12 13 14"))
@click.argument("job_ids", metavar="JOB...", type=int, nargs=-1, required=True)
def cancel(job_ids: tuple[int, ...]) -> None:
    """Cancel queued or running jobs (or stop Ray jobs); their GPUs are released at once."""
    client = portal()
    for job_id in job_ids:
        try:
            click.echo(job_line(client.jobs.cancel(job_id), timer=False))
        except NotFound as missing:
            cluster = find_cluster_or(client, job_id, missing)
            click.echo(describe(client.ray_clusters.delete(cluster.id), timer=False))


@cli.group(epilog=examples("gpuportal artifacts ls 12", "gpuportal artifacts get 12 -o results/"))
def artifacts() -> None:
    """A job's (or Ray job's) artifacts: the files under its artifact paths, recorded when it ended."""


@artifacts.command("ls", epilog=examples("gpuportal artifacts ls 12", "gpuportal artifacts ls 12 --json"))
@JOB_ID
@json_option
def list_artifacts(job_id: int, as_json: bool) -> None:
    """List a job's artifacts with their size and sha256."""
    job = _job_or_ray_job(portal(), job_id)
    if as_json:
        print_json(job.data.get("artifacts", []))
        return
    print_table([{"Path": a.path, "Bytes": str(a.size_bytes), "SHA256": a.sha256} for a in job.artifacts])


@artifacts.command("get", epilog=examples(
    "gpuportal artifacts get 12                 # all, into the current folder",
    "gpuportal artifacts get 12 out/model.pt -o results/",
))  # fmt: skip
@JOB_ID
@click.argument("paths", nargs=-1)
@click.option("-o", "--output", "dest", default=".", type=click.Path(file_okay=False, path_type=Path),
              help="Folder to save into (created if needed).")  # fmt: skip
def get_artifacts(job_id: int, paths: tuple[str, ...], dest: Path) -> None:
    """Download a job's artifacts (all, or those under PATHS), checked against their sha256."""
    client = portal()
    try:
        saved = client.jobs.download_artifacts(job_id, dest, paths=list(paths) or None)
    except NotFound as missing:
        cluster = find_cluster_or(client, job_id, missing)
        saved = client.ray_clusters.download_artifacts(cluster.id, dest, paths=list(paths) or None)
    for path in saved:
        click.echo(str(path))
    if not saved:
        click.echo(f"Job {job_id} has no artifacts.", err=True)
