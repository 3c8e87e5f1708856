from django.apps import AppConfig


class ComputeConfig(AppConfig):
    name = "apps.compute"
    label = "compute"

    def ready(self) -> None:
        from apps.compute import (
            checks,  # noqa: F401  (registers the deployment checks)
            hosting,
        )

        hosting.register()
