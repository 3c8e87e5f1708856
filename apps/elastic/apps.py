from django.apps import AppConfig


class ElasticConfig(AppConfig):
    name = "apps.elastic"
    label = "elastic"
