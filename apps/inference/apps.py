from django.apps import AppConfig


class InferenceConfig(AppConfig):
    name = "apps.inference"
    label = "inference"

    def ready(self) -> None:
        from apps.inference import hosting
        from apps.inference.kind import ENDPOINT, REPLICA
        from apps.workloads import kinds

        kinds.register(ENDPOINT)
        kinds.register(REPLICA)
        hosting.register()
