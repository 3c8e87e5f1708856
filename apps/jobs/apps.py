from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "apps.jobs"
    label = "jobs"

    def ready(self) -> None:
        from apps.jobs.hosting import JobKind
        from apps.jobs.kind import JOB
        from apps.workloads import host, kinds

        kinds.register(JOB)
        host.register(JobKind())
