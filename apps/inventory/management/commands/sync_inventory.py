from typing import Any

from django.core.management.base import BaseCommand

from apps.inventory.actions import do_sync_local_cluster


class Command(BaseCommand):
    help = "Register this machine's GPUs (from NVML, or PORTAL_DECLARED_GPUS where there are none)."

    def handle(self, *args: Any, **options: Any) -> None:
        cluster = do_sync_local_cluster()
        for node in cluster.pools.get(name="default").nodes.all():
            gpus = list(node.gpus.all())
            source = "declared" if any(g.declared for g in gpus) else "NVML"
            kinds = ", ".join(sorted({g.model for g in gpus})) or "no GPUs"
            self.stdout.write(f"{cluster.name}/{node.name}: {len(gpus)} GPUs ({kinds}; {source})")
