"""Instances and notebooks as the portal's shared parts see them (apps/workloads/kinds.py)."""

from __future__ import annotations

from apps.audit.events import Event
from apps.compute.models import Instance, Notebook
from apps.workloads.kinds import KindInfo, Scheduling

INSTANCE = KindInfo(
    name="instance",
    model=Instance,
    label="Instance",
    token_states=(Instance.State.PROVISIONING, Instance.State.RUNNING),
    submit_event=Event.INSTANCE_LAUNCH,
    fail_event=Event.INSTANCE_FAIL,
    # Interactive work is never preempted; it holds its devices until it is deleted.
    scheduling=Scheduling(
        queued=Instance.State.QUEUED,
        admitted=Instance.State.PROVISIONING,
        holding=(Instance.State.PROVISIONING, Instance.State.RUNNING, Instance.State.DELETING),
        admit_event=Event.INSTANCE_ADMIT,
    ),
)

# A notebook runs on its instance's devices: the scheduler never admits it.
NOTEBOOK = KindInfo(
    name="notebook",
    model=Notebook,
    label="Notebook",
    token_states=(Notebook.State.STARTING, Notebook.State.READY),
    submit_event=Event.NOTEBOOK_LAUNCH,
    fail_event=Event.NOTEBOOK_FAIL,
)
