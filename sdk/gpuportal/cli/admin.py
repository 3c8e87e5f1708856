"""Platform admins' commands: `gpuportal admin replay` replays a window of the portal's history under
today's settings and under changes (quotas, cohorts, policy, cluster size), side by side per
workspace; `gpuportal admin replay-show` shows (or waits for) one replay; `gpuportal admin node`
cordons, drains and brings back a node, and `gpuportal admin maintenance` announces windows."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import click

from gpuportal.cli.app import EXIT_ERROR, EXIT_USAGE, Progress, cli, examples, fail, json_option, portal, print_json
from gpuportal.cli.app import print_table as print_rows
from gpuportal.client import Client
from gpuportal.models import fmt_duration

FIGURES = (
    ("jobs", "JOBS"), ("not_run", "NEVER RAN"), ("mean_wait_s", "MEAN WAIT"), ("p95_wait_s", "P95 WAIT"),
    ("mean_jct_s", "MEAN JCT"), ("preemptions", "PREEMPTIONS"), ("gpu_utilization", "GPU UTIL"),
)  # fmt: skip
ALL = "(all)"


@cli.group(epilog=examples(
    "gpuportal admin replay --since 2026-11-20 --quota team-b=+16 --wait",
    "gpuportal admin replay --since 2026-11-20T00:00Z --until 2026-11-27T00:00Z --min-runtime 600 --wait --csv out.csv",
    "gpuportal admin replay-show 3 --csv out.csv",
))  # fmt: skip
def admin() -> None:
    """Platform admins' commands (a 403 for anyone else)."""


def moment(text: str, option: str) -> str:
    """An ISO 8601 date or time as the API takes it; one without a zone is this machine's local time."""
    raw = text.strip()
    try:
        parsed = datetime.fromisoformat(raw[:-1] + "+00:00" if raw.endswith(("Z", "z")) else raw)
    except ValueError:
        fail(f"{option}: {text!r} is not a date or time, such as 2026-11-20 or 2026-11-20T09:00Z.", EXIT_USAGE)
    if parsed.tzinfo is None:
        parsed = parsed.astimezone()
    return parsed.isoformat()


@admin.command(epilog=examples(
    "gpuportal admin replay --since 2026-11-20 --quota team-b=+16 --wait",
    "gpuportal admin replay --since 2026-11-20 --cohort team-a= --policy fifo --cluster-gpus -8 --wait --csv out.csv",
))  # fmt: skip
@click.option("--since", required=True, help="Replay the workloads submitted from this date or time (ISO 8601).")
@click.option("--until", help="... up to this one (default: now).")
@click.option("--quota", "quotas", multiple=True, metavar="WORKSPACE=[+|-]N", help="A quota change, in whole GPUs.")
@click.option("--cohort", "cohorts", multiple=True, metavar="WORKSPACE=COHORT", help="A cohort change (empty: none).")
@click.option("--policy", type=click.Choice(["portal", "fifo", "shared"]), help="The scheduling policy.")
@click.option("--preemption/--no-preemption", default=None, help="Turn preemption on or off.")
@click.option("--min-runtime", "min_runtime_s", type=float, metavar="SECONDS", help="Never preempt a younger run.")
@click.option(
    "--starvation", "starvation_s", type=float, metavar="SECONDS", help="Hold nodes for a gang blocked longer."
)
@click.option("--cluster-gpus", metavar="[+|-]N", help="GPUs in the cluster: more, fewer, or so many.")
@click.option("--wait", is_flag=True, help="Wait for the figures and print them side by side.")
@click.option("--timeout", type=float, metavar="SECONDS", help="With --wait: give up after this long (exit 124).")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, path_type=Path), help="With --wait: write the CSV.")
@json_option
def replay(
    since: str, until: str | None, quotas: tuple[str, ...], cohorts: tuple[str, ...], policy: str | None,
    preemption: bool | None, min_runtime_s: float | None, starvation_s: float | None, cluster_gpus: str | None,
    wait: bool, timeout: float | None, csv_path: Path | None, as_json: bool,
) -> None:  # fmt: skip
    """Replay a window of the portal's history under today's settings and under your changes, and
    compare mean and p95 wait, JCT, preemptions and GPU utilisation per workspace. It runs in the
    background on the portal and changes nothing live; without --wait this prints its id."""
    if csv_path is not None and not wait:
        fail("--csv needs --wait: the figures exist once it is done.", EXIT_USAGE)
    for option, value in (("--min-runtime", min_runtime_s), ("--starvation", starvation_s)):
        if value is not None and not 0 <= value < float("inf"):
            fail(f"{option} must be 0 seconds or more.", EXIT_USAGE)
    client = portal()
    started = client.start_replay(
        since=moment(since, "--since"), until=moment(until, "--until") if until else None, quotas=list(quotas),
        cohorts=list(cohorts), policy=policy, preemption=preemption, min_runtime_s=min_runtime_s,
        starvation_s=starvation_s, cluster_gpus=cluster_gpus,
    )  # fmt: skip
    if not wait:
        if as_json:
            print_json(started)
        else:
            click.echo(f"What-if replay {started['id']} started: gpuportal admin replay-show {started['id']} --wait")
        return
    finish(client, started["id"], timeout=timeout, csv_path=csv_path, as_json=as_json)


@admin.command("replay-show", epilog=examples(
    "gpuportal admin replay-show 3",
    "gpuportal admin replay-show 3 --wait --csv out.csv",
))  # fmt: skip
@click.argument("replay_id", type=int)
@click.option("--wait", is_flag=True, help="Wait for it to finish.")
@click.option("--timeout", type=float, metavar="SECONDS", help="With --wait: give up after this long (exit 124).")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, path_type=Path), help="Write its figures as CSV.")
@json_option
def replay_show(replay_id: int, wait: bool, timeout: float | None, csv_path: Path | None, as_json: bool) -> None:
    """Show a what-if replay: its progress, or its figures side by side."""
    client = portal()
    if wait:
        finish(client, replay_id, timeout=timeout, csv_path=csv_path, as_json=as_json)
        return
    shown = client.replay(replay_id)
    if csv_path is not None and shown["state"] != "SUCCEEDED":
        fail(f"What-if replay {replay_id} is {shown['state'].lower()}: it has no figures to write.", EXIT_ERROR)
    report(client, shown, csv_path=csv_path, as_json=as_json)


def finish(client: Client, replay_id: int, *, timeout: float | None, csv_path: Path | None, as_json: bool) -> None:
    progress = Progress(describe, lambda r: r["state"])
    try:
        done = client.wait_replay(replay_id, timeout_s=timeout, on_progress=progress)
    finally:
        progress.close()
    report(client, done, csv_path=csv_path, as_json=as_json)


def describe(run: dict[str, Any]) -> str:
    state = run["state"]
    if state == "RUNNING":
        return f"What-if replay {run['id']}: running, {run['progress']:.0%}"
    return f"What-if replay {run['id']}: {state.lower()}"


def report(client: Client, run: dict[str, Any], *, csv_path: Path | None, as_json: bool) -> None:
    """The replay as JSON or a table (and its CSV where asked); exit 1 if it failed."""
    if as_json:
        print_json(run)
    elif run["state"] == "SUCCEEDED":
        click.echo(f"Changes: {'; '.join(run['changes_text'])}")
        print_rows(side_by_side(run["result"]))
        skipped = run["result"]["skipped"]
        click.echo(
            f"{run['result']['workloads']} workloads replayed; left out: {skipped['never_started']} that never "
            f"started, {skipped['no_gpus']} without GPUs. Each cell: what-if (today)."
        )
    else:
        click.echo(describe(run))
    if run["state"] == "FAILED":
        fail(f"What-if replay {run['id']} failed: {run['message']}", EXIT_ERROR)
    if csv_path is not None:
        csv_path.write_text(client.replay_csv(run["id"]))
        click.echo(f"Wrote {csv_path}", err=True)


def side_by_side(result: dict[str, Any]) -> list[dict[str, str]]:
    """One row per workspace (all together first): each figure as "what-if (today)"."""
    base, changed = result["baseline"], result["whatif"]
    names = [ALL, *sorted((set(base) | set(changed)) - {ALL})]
    rows = []
    for name in names:
        row = {"WORKSPACE": name}
        for key, title in FIGURES:
            before, after = base.get(name, {}).get(key, 0), changed.get(name, {}).get(key, 0)
            row[title] = f"{cell(key, after)} ({cell(key, before)})"
        rows.append(row)
    return rows


def cell(key: str, value: float) -> str:
    if key == "gpu_utilization":
        return f"{value:.1%}"
    if key.endswith("_s"):
        return fmt_duration(timedelta(seconds=value))
    return str(value)


# --- Node maintenance ---------------------------------------------------------------------------------


def cluster_node(target: str) -> tuple[str, str]:
    """CLUSTER/NODE as its two names."""
    cluster, _, node = target.partition("/")
    if not cluster or not node or "/" in node:
        fail(f"{target!r}: name a node as CLUSTER/NODE, such as slurm/node3.", EXIT_USAGE)
    return cluster, node


def node_line(node: dict[str, Any]) -> str:
    what = node["maintenance"] or "in service"
    why = f" ({node['maintenance_reason']})" if node.get("maintenance_reason") else ""
    return f"Node {node['cluster']}/{node['name']}: {what}{why}; the cluster reports it {node['state']}."


@admin.group(epilog=examples(
    'gpuportal admin node cordon slurm/node3 --reason "fan noise"',
    'gpuportal admin node drain slurm/node3 --reason "BIOS update" --grace 300',
    "gpuportal admin node uncordon slurm/node3",
))  # fmt: skip
def node() -> None:
    """Node maintenance: cordon (no new work), drain (work moved off or waited out), uncordon (back)."""


@node.command(epilog=examples('gpuportal admin node cordon slurm/node3 --reason "fan noise"'))
@click.argument("target", metavar="CLUSTER/NODE")
@click.option("--reason", default="", help="Why (shown to admins; on Slurm, the node's drain reason).")
@json_option
def cordon(target: str, reason: str, as_json: bool) -> None:
    """Place no new work on the node; what runs there goes on."""
    cluster, name = cluster_node(target)
    done = portal().cordon_node(cluster, name, reason=reason)
    print_json(done) if as_json else click.echo(node_line(done))


@node.command(epilog=examples('gpuportal admin node drain slurm/node3 --reason "BIOS update" --grace 300'))
@click.argument("target", metavar="CLUSTER/NODE")
@click.option("--reason", default="", help="Why (in the evicted work's reason and the audit trail).")
@click.option("--grace", "grace_s", type=click.IntRange(0, 3600), metavar="SECONDS",
              help="Time the work moved off gets to checkpoint (default: the portal's preemption grace).")  # fmt: skip
@json_option
def drain(target: str, reason: str, grace_s: int | None, as_json: bool) -> None:
    """Cordon the node and move its work off: preemptible jobs and Ray clusters are given their grace
    and requeued; endpoint replicas serve on until their replacements on other nodes serve;
    instances and work not preemptible are waited out. The node is "drained" once it is empty."""
    cluster, name = cluster_node(target)
    done = portal().drain_node(cluster, name, reason=reason, grace_s=grace_s)
    print_json(done) if as_json else click.echo(node_line(done))


@node.command(epilog=examples("gpuportal admin node uncordon slurm/node3"))
@click.argument("target", metavar="CLUSTER/NODE")
@json_option
def uncordon(target: str, as_json: bool) -> None:
    """Bring the node back into service."""
    cluster, name = cluster_node(target)
    done = portal().uncordon_node(cluster, name)
    print_json(done) if as_json else click.echo(node_line(done))


@admin.group(epilog=examples(
    'gpuportal admin maintenance announce slurm --node node3 --start 2026-12-01T08:00Z --end 2026-12-01T12:00Z '
    '--reason "New power supply"',
    "gpuportal admin maintenance list",
    "gpuportal admin maintenance withdraw 4",
))  # fmt: skip
def maintenance() -> None:
    """Maintenance windows: announced to the users whose work they affect, their nodes drained at
    the start and back at the end."""


@maintenance.command("list", epilog=examples("gpuportal admin maintenance list --cluster slurm"))
@click.option("--cluster", help="Only this cluster's windows.")
@json_option
def maintenance_list(cluster: str | None, as_json: bool) -> None:
    """The maintenance windows, soonest first."""
    windows = portal().maintenance_windows(cluster)
    if as_json:
        print_json(windows)
        return
    print_rows([{"ID": str(w["id"]), "CLUSTER": w["cluster"], "NODES": ",".join(w["nodes"]) or "(all)",
                 "START": w["start_at"], "END": w["end_at"], "STATE": w["state"], "REASON": w["reason"]}
                for w in windows])  # fmt: skip


@maintenance.command("announce", epilog=examples(
    'gpuportal admin maintenance announce slurm --node node3 --start 2026-12-01T08:00Z --end 2026-12-01T12:00Z '
    '--reason "firmware"',
))  # fmt: skip
@click.argument("cluster")
@click.option("--node", "nodes", multiple=True, help="A node of the cluster (repeat; none: all of them).")
@click.option("--start", required=True, help="When it begins (ISO 8601; without a zone, this machine's time).")
@click.option("--end", required=True, help="When it ends.")
@click.option("--reason", required=True, help="Why: the users affected read it.")
@json_option
def maintenance_announce(
    cluster: str, nodes: tuple[str, ...], start: str, end: str, reason: str, as_json: bool
) -> None:
    """Announce a window; the users whose work it affects are mailed."""
    window = portal().announce_maintenance(
        cluster, nodes=list(nodes), start_at=moment(start, "--start"), end_at=moment(end, "--end"), reason=reason
    )
    if as_json:
        print_json(window)
    else:
        told = ", ".join(window["workspaces"]) or "no workspace (nothing affected now)"
        click.echo(f"Maintenance window {window['id']} announced; work affected in: {told}.")


@maintenance.command("withdraw", epilog=examples("gpuportal admin maintenance withdraw 4"))
@click.argument("window_id", type=int)
def maintenance_withdraw(window_id: int) -> None:
    """Withdraw a window; one under way ends at once and its nodes come back."""
    portal().withdraw_maintenance(window_id)
    click.echo(f"Maintenance window {window_id} withdrawn.")
