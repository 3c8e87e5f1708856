import json
from argparse import RawDescriptionHelpFormatter
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser, DjangoHelpFormatter

from apps.errors import ActionError
from apps.inventory.actions import do_register_cluster
from apps.inventory.models import Cluster, Node

EXAMPLES = """\
examples:
  manage.py register_cluster slurm --kind slurm --partition gpu
      register the Slurm partition 'gpu' as the cluster 'slurm': its nodes (CPUs, memory, state)
      and GPUs (one per GRES gpu, typed by the GRES type, e.g. gpu:h100:4 -> 4 x h100)
  manage.py register_cluster slurm
      run again at any time: refreshes the nodes and GPUs; nothing is duplicated
  manage.py register_cluster k8s --kind kubernetes --connection '{"ingress_mode": "host"}'
      register the Kubernetes cluster the portal runs in (its pods' service account) with these
      connection settings (docs/kubernetes.md); the Helm chart's post-install Job runs this

Jobs then target it with "cluster": "slurm" in POST /api/v1/jobs/. The Slurm commands
(scontrol, sbatch, squeue, sacct, scancel) must work for the user the portal's worker runs as.
This machine's own GPUs are registered by sync_inventory, as the cluster 'local'.
"""


class _HelpFormatter(DjangoHelpFormatter, RawDescriptionHelpFormatter):
    pass


class Command(BaseCommand):
    help = (
        "Register a Slurm or Kubernetes cluster with the nodes and GPUs it reports, or refresh one registered before."
    )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        kwargs.setdefault("epilog", EXAMPLES)
        kwargs.setdefault("formatter_class", _HelpFormatter)
        return super().create_parser(prog_name, subcommand, **kwargs)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="the cluster's name in the portal (a DNS label, e.g. slurm)")
        parser.add_argument(
            "--kind",
            choices=[Cluster.Kind.SLURM.value, Cluster.Kind.KUBERNETES.value],
            default=Cluster.Kind.SLURM.value,
            help="default: slurm",
        )
        parser.add_argument(
            "--partition", help="the Slurm partition whose nodes the portal uses (default: gpu, or as registered)"
        )
        parser.add_argument(
            "--connection",
            default="{}",
            help="connection settings as a JSON object, merged over those registered before (no credentials)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            connection = json.loads(options["connection"])
        except json.JSONDecodeError as exc:
            raise CommandError(f"--connection is not JSON: {exc}") from None
        if not isinstance(connection, dict):
            raise CommandError('--connection must be a JSON object, e.g. \'{"ingress_mode": "host"}\'.')
        if options["partition"]:
            connection["partition"] = options["partition"]
        try:
            cluster = do_register_cluster(options["name"], kind=options["kind"], connection=connection)
        except ActionError as exc:
            raise CommandError(exc.message) from None
        nodes = Node.objects.filter(pool__cluster=cluster).prefetch_related("gpus").order_by("name")
        for node in nodes:
            gpus = list(node.gpus.all())
            kinds = ", ".join(sorted({g.gpu_type for g in gpus})) or "no GPUs"
            self.stdout.write(
                f"{cluster.name}/{node.name}: {len(gpus)} GPUs ({kinds}), {node.cpu_cores} CPUs, "
                f"{node.memory_gb} GB, {node.state}"
            )
        total = sum(len(node.gpus.all()) for node in nodes)
        self.stdout.write(
            f"cluster {cluster.name} ({cluster.kind}"
            + (f", partition {cluster.connection['partition']}" if "partition" in cluster.connection else "")
            + "): "
            f"{len(nodes)} nodes, {total} GPUs{' (the default cluster)' if cluster.is_default else ''}"
        )
