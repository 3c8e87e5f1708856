from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "apps.console"
    label = "console"
    verbose_name = "Admin console"
