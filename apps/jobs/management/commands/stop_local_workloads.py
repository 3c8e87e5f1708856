import os
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from apps.workloads.host import stop_on_this_machine
from apps.workspaces import disks
from workers.backends import diskquota
from workers.backends.local import LocalBackend


class Command(BaseCommand):
    help = (
        "Stop every process the local backend runs (run when the embedded portal stops): jobs are "
        "requeued; instances and notebooks keep their state and are started again at the next start. The "
        "workspaces' disks are unmounted: they are mounted again when next used."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        stopped = stop_on_this_machine()
        # A start the worker had under way when it was stopped left processes no row records yet:
        # with every process of the portal stopped, nothing of this portal's may run on.
        strays = LocalBackend().sweep_orphans(str(settings.PORTAL_WORK_DIR))
        if disks.enforced() and os.geteuid() == 0:  # nothing uses them now; mounted again at the next start
            diskquota.unmount_under(str(settings.PORTAL_WORK_DIR))
        self.stdout.write(
            f"stopped {stopped} workload(s)" + (f" and {len(strays)} unrecorded one(s)" if strays else "")
        )
