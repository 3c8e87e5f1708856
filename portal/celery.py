import os

from celery import Celery

import portal.broker  # noqa: F401  (registers the embedded broker's transport, atomicfs)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["workers"], related_name="tasks")
