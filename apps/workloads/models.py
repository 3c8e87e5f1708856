"""What the workload host keeps of every kind of workload (jobs, instances, notebooks).

The backend's own record of a workload, its reattach state, is ``backend_state``: written only
from ``Backend.get_state()``, read only by a backend built from it. The portal's bookkeeping of
the lifecycle lives in typed columns beside it, never inside it.
"""

from __future__ import annotations

from django.db import models


class Hosted(models.Model):
    # The backend's reattach state (Backend.get_state()); None until a start of it is recorded,
    # and again once its backend stopped it and forgot it.
    backend_state = models.JSONField(null=True, blank=True, default=None)
    # A start under way (apps/workloads/claims.py): its token, when, and which process made it.
    start_claim = models.JSONField(null=True, blank=True, default=None)
    # How many times its processes died and were started again in place (PORTAL_RESTART_LIMIT).
    restarts = models.PositiveIntegerField(default=0)
    # Its backend stopped it and what it left was recorded; its state is kept to read logs from.
    backend_stopped = models.BooleanField(default=False)

    class Meta:
        abstract = True
