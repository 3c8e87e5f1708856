from django.apps import AppConfig


class ManifestsConfig(AppConfig):
    name = "apps.manifests"
    label = "manifests"
