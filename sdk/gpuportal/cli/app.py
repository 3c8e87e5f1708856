"""The `gpuportal` command group, its error handling and the output helpers every command shares.

Exit codes: 0 success; 2 a bad command line or job spec (ours or the portal's refusal of a
field); 1 any other error. Commands that follow a job to its end exit with the job's code.
`apply` and `diff` have their own (cli/manifests.py): `apply` 1 on any error, `diff` 1 for
differences and 2 on an error, as `kubectl diff`.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TextIO, TypeVar

import click

from gpuportal import __version__
from gpuportal.client import Client
from gpuportal.errors import GPUPortalError, SpecError, ValidationError, WaitTimeout
from gpuportal.models import Job, Model, StartStep, StepFollower, fmt_duration, fmt_estimate
from gpuportal.spec import ALIASES

F = TypeVar("F", bound=Callable[..., Any])

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_CANCELLED = 130
EXIT_TIMEOUT = 124
# API field -> spec field, to name a refused field as the spec file does.
SPEC_FIELD = {api: spec for api, spec in ALIASES.items()}


def examples(*lines: str) -> str:
    """An epilog of examples, kept as written by the help formatter."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


class PortalGroup(click.Group):
    """Turns the SDK's typed errors into one line on stderr and an exit code: no tracebacks."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (SpecError, ValidationError) as exc:
            fail(describe_error(exc), EXIT_USAGE)
        except WaitTimeout as exc:
            fail(exc.message, EXIT_TIMEOUT)
        except GPUPortalError as exc:
            fail(describe_error(exc), EXIT_ERROR)
        except OSError as exc:  # a folder that cannot be written, a file that cannot be read
            where = f" ({exc.filename})" if exc.filename else ""
            fail(f"{exc.strerror or exc}{where}", EXIT_ERROR)
        except KeyboardInterrupt:
            fail("Interrupted.", EXIT_CANCELLED)


def describe_error(exc: GPUPortalError) -> str:
    if isinstance(exc, ValidationError) and len(exc.fields) > 1:
        return "; ".join(f"{SPEC_FIELD.get(k, k)}: {' '.join(v)}" for k, v in exc.fields.items())
    if isinstance(exc, ValidationError) and exc.fields:
        field, messages = next(iter(exc.fields.items()))
        if field == "non_field_errors":
            return " ".join(messages)
        return f"{SPEC_FIELD.get(field, field)}: {' '.join(messages)}"
    return exc.message


def fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    click.echo(f"Error: {message}", err=True)
    raise click.exceptions.Exit(code)


@click.group(cls=PortalGroup, epilog=examples(
    "gpuportal login --url http://127.0.0.1:8000 --username demo",
    "gpuportal submit job.yaml --wait",
    "gpuportal queue",
    "gpuportal logs -f 12",
))  # fmt: skip
@click.version_option(__version__, prog_name="gpuportal")
def cli() -> None:
    """GPU Portal from a terminal: submit jobs and walk away, follow them in the queue and while they
    run, read their logs and collect their artifacts; launch instances and notebooks; deploy models
    at inference endpoints.

    The portal and token come from GPUPORTAL_URL and GPUPORTAL_TOKEN, or from `gpuportal login`.
    """


def portal() -> Client:
    """The client for this invocation, made once from the environment and the configuration file."""
    ctx = click.get_current_context().find_root()
    if ctx.obj is None:
        ctx.obj = Client.from_env()
        ctx.call_on_close(ctx.obj.close)
    client = ctx.obj
    assert isinstance(client, Client)
    return client


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print the API's JSON instead of a table.")(func)


def workspace_option(func: F) -> F:
    return click.option("-w", "--workspace", help="Workspace name (default: the configured one, else yours).")(func)


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def print_table(rows: Sequence[dict[str, str]], stream: TextIO | None = None) -> None:
    """Rows of the same columns as aligned text; on a terminal, the last column is cut to fit."""
    stream = stream or sys.stdout
    if not rows:
        click.echo("(none)", file=stream)
        return
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(r.get(c, "")) for r in rows)) for c in columns}
    limit = shutil.get_terminal_size().columns if stream.isatty() else None
    for row in [dict(zip(columns, columns, strict=True)), *rows]:
        cells = [row.get(c, "").ljust(widths[c]) for c in columns[:-1]] + [row.get(columns[-1], "")]
        line = "  ".join(cells).rstrip()
        if limit and len(line) > limit:
            line = line[: limit - 1] + "…"
        click.echo(line, file=stream)


def print_models(items: Sequence[Model], as_json: bool) -> None:
    if as_json:
        print_json([item.data for item in items])
    else:
        print_table([item.summary() for item in items])


def print_details(item: Model, as_json: bool) -> None:
    if as_json:
        print_json(item.data)
        return
    lines = [(label, text) for label, text in item.details() if text]
    width = max(len(label) for label, _ in lines)
    for label, text in lines:
        click.echo(f"{label + ':':<{width + 1}} {text}")


def job_exit_code(job: Job) -> int:
    """The job's outcome as a process exit code: 0 for success, the job's own non-zero code for a
    failure (124 after its max runtime, 128+N when killed by signal N), 1 for a failure without
    one, 130 for a cancelled job."""
    if job.state == "SUCCEEDED":
        return 0
    if job.state == "CANCELLED":
        return EXIT_CANCELLED
    if job.exit_code is not None and 0 < job.exit_code < 256:
        return job.exit_code
    return EXIT_ERROR


def job_line(job: Job, *, timer: bool = True) -> str:
    """One line saying where a job stands: its queue position and reason, or how long it has run."""
    head = f"Job {job.id} {job.name}: {job.state}"
    if job.state == "QUEUED":
        queue = job.queue_info
        parts = []
        if queue.position is not None:
            parts.append(f"#{queue.position} in {job.workspace}")
        if queue.cluster_position is not None:
            parts.append(f"#{queue.cluster_position} in the cluster")
        if queue.reason:
            parts.append(queue.reason)
        if timer:
            parts.append(f"estimated start {fmt_estimate(queue.estimated_start_at)}")
        return head + (", " + ", ".join(parts) if parts else "")
    if job.state == "PREEMPTED":
        return f"{head}, {job.queue_info.reason or 'preempted'}; it goes back in the queue"
    running = job.running_for
    if job.state == "RUNNING":
        text = f"{head} for {fmt_duration(running)}" if running and timer else head
        return text + (f" ({job.progress:.0%})" if job.progress is not None and timer else "")
    if job.is_final:
        text = head + (f" with exit code {job.exit_code}" if job.exit_code not in (None, 0) else "")
        text += f" after {fmt_duration(running)}" if running else ""
        return text + (f": {job.failure_reason}" if job.failure_reason else "")
    return head


class Progress:
    """The display while waiting, on stderr: one line rewritten in place on a terminal, else a new
    line each time the state, queue position or reason changes; and a line of its own for each
    step of the workload's start as it begins (waiting for a worker, building the environment,
    starting, waiting for an answer), with the time it began."""

    def __init__(self, describe: Callable[[Any], str], key: Callable[[Any], str], stream: TextIO | None = None):
        self.describe, self.key = describe, key
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.last_key: str | None = None
        self.drawn = False
        self.steps = StepFollower(self.step)

    def step(self, step: StartStep) -> None:
        """One step of the start, as it began: a line of its own, above the live line."""
        self.pause()
        self.stream.write(f"  {step.line()}\n")

    def __call__(self, obj: Any) -> None:
        self.steps(obj)
        if self.live:
            width = shutil.get_terminal_size().columns - 1
            self.stream.write("\r\x1b[K" + self.describe(obj)[:width])
            self.drawn = True
        elif self.key(obj) != self.last_key:
            self.stream.write(self.describe(obj) + "\n")
        self.last_key = self.key(obj)
        self.stream.flush()

    def pause(self) -> None:
        """Clear the live line so that other output (a log) can be written."""
        if self.live and self.drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.drawn = False

    def close(self) -> None:
        if self.live and self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False


def job_progress(stream: TextIO | None = None) -> Progress:
    return Progress(job_line, lambda job: job_line(job, timer=False), stream)
