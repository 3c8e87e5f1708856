from typing import Any

from django.core.management.base import BaseCommand

from apps.jobs.running import stop_local_jobs


class Command(BaseCommand):
    help = "Stop every job running on this machine and requeue it (run when the embedded portal stops)."

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(f"requeued {stop_local_jobs()} running job(s)")
