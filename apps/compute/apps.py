from django.apps import AppConfig


class ComputeConfig(AppConfig):
    name = "apps.compute"
    label = "compute"

    def ready(self) -> None:
        from apps.compute import (
            checks,  # noqa: F401  (registers the deployment checks)
            hosting,
        )
        from apps.compute.kind import INSTANCE, NOTEBOOK
        from apps.workloads import kinds

        kinds.register(INSTANCE)
        kinds.register(NOTEBOOK)
        hosting.register()
