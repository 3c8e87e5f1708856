from django.apps import AppConfig


class WebConfig(AppConfig):
    name = "apps.web"
    label = "web"
    verbose_name = "Web pages"
