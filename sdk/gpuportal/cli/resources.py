"""Account and resource commands: login, logout, whoami, workspaces, profiles, instances, notebooks."""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import click

from gpuportal import config
from gpuportal.cli.app import (
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
    print_table,
    workspace_option,
)
from gpuportal.client import Client
from gpuportal.errors import GPUPortalError
from gpuportal.models import Instance, Notebook, fmt_duration


@cli.command(epilog=examples(
    "gpuportal login --url https://portal.example.org --browser     # single sign-on, in the browser",
    "gpuportal login --url http://127.0.0.1:8000 --username demo     # asks for the password",
    "gpuportal login --url https://portal.example.org --token \"$TOKEN\"",
    "echo \"$PASSWORD\" | gpuportal login --username demo --password-stdin",
    "gpuportal login --workspace demo-team                          # change the default workspace",
))  # fmt: skip
@click.option("--url", help="The portal's address (default: GPUPORTAL_URL, the saved one, or asked).")
@click.option("--token", help="An API token. Without it, give --username or paste one when asked.")
@click.option("-u", "--username", help="Sign in with a username and password to get a token.")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
@click.option(
    "--browser",
    is_flag=True,
    help="Sign in on the portal's web page (single sign-on too): prints a link and a code, opens a browser if any.",
)
@click.option("--no-open", is_flag=True, help="With --browser: only print the link (a terminal without a browser).")
@workspace_option
def login(
    url: str | None,
    token: str | None,
    username: str | None,
    password_stdin: bool,
    browser: bool,
    no_open: bool,
    workspace: str | None,
) -> None:
    """Store a portal URL and API token in ~/.config/gpuportal/config.yaml, checked first.

    On a portal that signs in through an identity provider, use --browser: sign in there, allow the
    code the terminal shows, and the token comes back here."""
    saved = config.read_file()
    url = url or os.environ.get("GPUPORTAL_URL") or saved.url
    if not url:
        url = click.prompt("Portal URL", default=config.DEFAULT_URL)
    if token:
        client = Client(url, token)
    elif browser:
        client = Client.login_in_browser(url, lambda page, code, link: _show_code(page, code, link, no_open))
    elif username or password_stdin:
        username = username or click.prompt("Username")
        password = sys.stdin.readline().rstrip("\r\n") if password_stdin else click.prompt("Password", hide_input=True)
        client = Client.login(url, username, password)
    elif saved.token and saved.url == url and workspace:
        client = Client(url, saved.token)  # only changing the default workspace
    else:
        if not sys.stdin.isatty():
            fail("Give --token, --browser, or --username to sign in with a password.", EXIT_USAGE)
        token = click.prompt(
            "API token (or run again with --browser, or --username to sign in with a password)", hide_input=True
        )
        client = Client(url, token)
    with client:
        me = client.me()
        if workspace:
            client.workspaces.get(workspace)
        default = workspace or (saved.workspace if saved.url == url else None)
        path = config.write_file(config.Config(url=url, token=client.token, workspace=default))
    click.echo(f"Logged in to {url} as {me.username}; saved in {path}.")
    click.echo(f"Workspaces: {', '.join(me.workspaces)}; jobs go to {default or me.private_workspace} by default.")


def _show_code(page: str, code: str, link: str, no_open: bool) -> None:
    click.echo(f"Open {page} and allow the code {code}")
    click.echo(f"(or go straight to {link}). Waiting...")
    if not no_open:
        import contextlib
        import webbrowser

        with contextlib.suppress(webbrowser.Error):  # no browser here: the link above is enough
            webbrowser.open(link)


@cli.command(epilog=examples("gpuportal logout"))
def logout() -> None:
    """Revoke the saved token on the portal and forget it (the portal URL is kept)."""
    saved = config.read_file()
    revoked = ""
    if saved.url and saved.token:
        try:
            with Client(saved.url, saved.token) as client:
                revoked = "revoked it on the portal and " if client.revoke_token() else ""
        except GPUPortalError as error:  # already revoked or expired, or the portal is out of reach
            revoked = f"could not revoke it on the portal ({error}); "
    path = config.write_file(config.Config(url=saved.url, workspace=saved.workspace))
    click.echo(f"Logged out; {revoked}removed the token from {path}.")


@cli.command(epilog=examples("gpuportal whoami", "gpuportal whoami --json"))
@json_option
def whoami(as_json: bool) -> None:
    """Show the portal, your user, your workspaces and the default one."""
    client = portal()
    me = client.me()
    if as_json:
        print_json({**me.data, "url": client.url, "default_workspace": client.default_workspace()})
        return
    click.echo(f"{me.username} on {client.url}")
    click.echo(f"Workspaces: {', '.join(me.workspaces)} (default: {client.default_workspace()})")


@cli.command(epilog=examples("gpuportal workspaces", "gpuportal workspaces --json"))
@json_option
def workspaces(as_json: bool) -> None:
    """List the workspaces you can use, with their GPU quota and use."""
    print_models(portal().workspaces.list(), as_json)


@cli.command(epilog=examples("gpuportal profiles", "gpuportal profiles --json"))
@json_option
def profiles(as_json: bool) -> None:
    """List the compute profiles (instance sizes), notebook profiles and inference profiles
    (endpoints' servers and replica sizes) you may use."""
    client = portal()
    compute, notebooks = client.profiles.compute(), client.profiles.notebooks()
    inference = client.profiles.inference()
    if as_json:
        print_json({
            "compute": [p.data for p in compute], "notebook": [p.data for p in notebooks],
            "inference": [p.data for p in inference],
        })  # fmt: skip
        return
    click.echo("Compute profiles:")
    print_table([p.summary() for p in compute])
    click.echo("\nNotebook profiles:")
    print_table([p.summary() for p in notebooks])
    click.echo("\nInference profiles:")
    print_table([p.summary() for p in inference])


def _instance_line(instance: Instance) -> str:
    text = f"Instance {instance.id} {instance.name}: {instance.state}"
    if instance.state == "QUEUED" and instance.queue_info.position is not None:
        text += f", #{instance.queue_info.position} in {instance.workspace}"
    if instance.state == "QUEUED" and instance.queue_info.reason:
        text += f", {instance.queue_info.reason}"
    if instance.running_for_s and instance.state == "RUNNING":
        text += f" for {fmt_duration(timedelta(seconds=instance.running_for_s))}"
    return text + (f": {instance.failure_reason}" if instance.failure_reason else "")


def _notebook_line(notebook: Notebook) -> str:
    text = f"Notebook {notebook.id} {notebook.name}: {notebook.state}"
    if notebook.is_ready and notebook.url:
        text += f" at {notebook.url}"
    return text + (f": {notebook.failure_reason}" if notebook.failure_reason else "")


@cli.group(epilog=examples(
    "gpuportal instances ls",
    "gpuportal instances create dev --profile gpu-1 -w demo-team --wait",
    "gpuportal instances delete 3 --yes",
))  # fmt: skip
def instances() -> None:
    """Compute instances: launched from a profile, QUEUED until admitted, then PROVISIONING and RUNNING."""


@instances.command("ls", epilog=examples("gpuportal instances ls", "gpuportal instances ls -w demo-team --json"))
@workspace_option
@click.option("--state", "states", multiple=True, help="Only instances in this state (repeat).")
@json_option
def list_instances(workspace: str | None, states: tuple[str, ...], as_json: bool) -> None:
    """List instances."""
    print_models(portal().instances.list(workspace, list(states) or None), as_json)


@instances.command("create", epilog=examples(
    "gpuportal instances create dev --profile gpu-1",
    "gpuportal instances create big --profile gpu-8 -w demo-team --wait --timeout 600",
))  # fmt: skip
@click.argument("name")
@click.option("-p", "--profile", required=True, help="Compute profile (see `gpuportal profiles`).")
@workspace_option
@click.option("--description", default="", help="What it is for.")
@click.option("--wait", "wait_", is_flag=True, help="Wait until it is RUNNING.")
@click.option("--timeout", type=float, help="With --wait: give up after this many seconds (exit 124).")
@json_option
def create_instance(
    name: str, profile: str, workspace: str | None, description: str, wait_: bool, timeout: float | None, as_json: bool
) -> None:
    """Launch an instance from a compute profile."""
    client = portal()
    instance = client.instances.create(name, profile=profile, workspace=workspace, description=description)
    click.echo(f"Launched instance {instance.id} ({instance.name}) in workspace {instance.workspace}.", err=True)
    if wait_:
        instance = _wait_instance(client, instance.id, timeout)
    if as_json:
        print_json(instance.data)
    elif not wait_:
        click.echo(_instance_line(instance))


def _wait_instance(client: Client, instance_id: int, timeout: float | None) -> Instance:
    progress = Progress(_instance_line, lambda i: f"{i.state} {i.queue_info.position} {i.queue_info.reason}")
    try:
        return client.instances.wait_ready(instance_id, timeout=timeout, on_update=progress)
    finally:
        progress.close()


@instances.command("status", epilog=examples("gpuportal instances status 3"))
@click.argument("instance_id", metavar="INSTANCE", type=int)
@json_option
def instance_status(instance_id: int, as_json: bool) -> None:
    """Show one instance: state, and queue position and reason while it waits."""
    print_details(portal().instances.get(instance_id), as_json)


@instances.command("wait", epilog=examples("gpuportal instances wait 3 --timeout 600"))
@click.argument("instance_id", metavar="INSTANCE", type=int)
@click.option("--timeout", type=float, help="Give up after this many seconds (exit 124).")
def wait_instance(instance_id: int, timeout: float | None) -> None:
    """Wait until an instance is RUNNING (exit 1 if it fails instead)."""
    _wait_instance(portal(), instance_id, timeout)


@instances.command("delete", epilog=examples("gpuportal instances delete 3", "gpuportal instances delete 3 --yes"))
@click.argument("instance_id", metavar="INSTANCE", type=int)
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
def delete_instance(instance_id: int, yes: bool) -> None:
    """Delete an instance and the notebooks on it, irreversibly."""
    client = portal()
    instance = client.instances.get(instance_id)
    if not yes and not click.confirm(f"Delete instance {instance.id} ({instance.name})?"):
        fail("Not deleted.")
    client.instances.delete(instance_id)
    click.echo(f"Deleted instance {instance.id} ({instance.name}).")


@cli.group(epilog=examples(
    "gpuportal notebooks launch lab --instance 3 --profile data-science --wait",
    "gpuportal notebooks url 5",
))  # fmt: skip
def notebooks() -> None:
    """Jupyter notebooks on an instance: PENDING, STARTING, then READY with a URL."""


@notebooks.command("ls", epilog=examples("gpuportal notebooks ls", "gpuportal notebooks ls --json"))
@workspace_option
@json_option
def list_notebooks(workspace: str | None, as_json: bool) -> None:
    """List notebooks."""
    print_models(portal().notebooks.list(workspace), as_json)


@notebooks.command("launch", epilog=examples(
    "gpuportal notebooks launch lab --instance 3 --profile minimal",
    "gpuportal notebooks launch lab --instance 3 --profile data-science --wait",
))  # fmt: skip
@click.argument("name")
@click.option("-i", "--instance", "instance_id", required=True, type=int, help="The instance to run it on.")
@click.option("-p", "--profile", required=True, help="Notebook profile (see `gpuportal profiles`).")
@click.option("--description", default="", help="What it is for.")
@click.option("--wait", "wait_", is_flag=True, help="Wait until it is READY, and print its URL.")
@click.option("--timeout", type=float, help="With --wait: give up after this many seconds (exit 124).")
@json_option
def launch_notebook(
    name: str, instance_id: int, profile: str, description: str, wait_: bool, timeout: float | None, as_json: bool
) -> None:
    """Launch a Jupyter notebook on an instance."""
    client = portal()
    notebook = client.notebooks.launch(instance_id, name, profile=profile, description=description)
    click.echo(f"Launched notebook {notebook.id} ({notebook.name}) on instance {instance_id}.", err=True)
    if wait_:
        progress = Progress(_notebook_line, lambda n: n.state)
        try:
            notebook = client.notebooks.wait_ready(notebook.id, timeout=timeout, on_update=progress)
        finally:
            progress.close()
    if as_json:
        print_json(notebook.data)
    else:
        click.echo(notebook.url if wait_ and notebook.url else _notebook_line(notebook))


@notebooks.command("status", epilog=examples("gpuportal notebooks status 5"))
@click.argument("notebook_id", metavar="NOTEBOOK", type=int)
@json_option
def notebook_status(notebook_id: int, as_json: bool) -> None:
    """Show one notebook: state and URL."""
    print_details(portal().notebooks.get(notebook_id), as_json)


@notebooks.command("url", epilog=examples("gpuportal notebooks url 5", 'xdg-open "$(gpuportal notebooks url 5)"'))
@click.argument("notebook_id", metavar="NOTEBOOK", type=int)
def notebook_url(notebook_id: int) -> None:
    """Print the URL that opens a READY notebook."""
    notebook = portal().notebooks.get(notebook_id)
    if not notebook.is_ready or not notebook.url:
        fail(f"Notebook {notebook.id} is {notebook.state}, not READY: it has no URL yet.")
    click.echo(notebook.url)


@notebooks.command("wait", epilog=examples("gpuportal notebooks wait 5 --timeout 300"))
@click.argument("notebook_id", metavar="NOTEBOOK", type=int)
@click.option("--timeout", type=float, help="Give up after this many seconds (exit 124).")
def wait_notebook(notebook_id: int, timeout: float | None) -> None:
    """Wait until a notebook is READY, then print its URL (exit 1 if it fails instead)."""
    progress = Progress(_notebook_line, lambda n: n.state)
    try:
        notebook = portal().notebooks.wait_ready(notebook_id, timeout=timeout, on_update=progress)
    finally:
        progress.close()
    click.echo(notebook.url or "")


@notebooks.command("delete", epilog=examples("gpuportal notebooks delete 5"))
@click.argument("notebook_id", metavar="NOTEBOOK", type=int)
def delete_notebook(notebook_id: int) -> None:
    """Stop and delete a notebook."""
    portal().notebooks.delete(notebook_id)
    click.echo(f"Deleted notebook {notebook_id}.")
