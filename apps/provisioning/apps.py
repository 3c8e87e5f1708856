from django.apps import AppConfig


class ProvisioningConfig(AppConfig):
    name = "apps.provisioning"
    label = "provisioning"
