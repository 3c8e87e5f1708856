"""The `gpuportal` command line."""

from gpuportal.cli import admin, endpoints, gprs, jobs, manifests, rayclusters, resources  # noqa: F401 - registers the commands
from gpuportal.cli.app import cli


def main() -> None:
    cli(prog_name="gpuportal")


__all__ = ["cli", "main"]
