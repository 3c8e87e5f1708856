from typing import Any

from django.core.management.base import BaseCommand

from apps.compute.running import stop_local_compute
from apps.jobs.running import stop_local_jobs


class Command(BaseCommand):
    help = (
        "Stop every process the local backend runs (run when the embedded portal stops): jobs are "
        "requeued; instances and notebooks keep their state and are started again at the next start."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        jobs = stop_local_jobs()
        compute = stop_local_compute()
        self.stdout.write(f"requeued {jobs} running job(s); stopped {compute} instance and notebook process group(s)")
