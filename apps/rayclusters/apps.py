from django.apps import AppConfig


class RayClustersConfig(AppConfig):
    name = "apps.rayclusters"
    label = "rayclusters"

    def ready(self) -> None:
        from apps.rayclusters import hosting
        from apps.rayclusters.kind import RAY_CLUSTER
        from apps.workloads import kinds

        kinds.register(RAY_CLUSTER)
        hosting.register()
