"""Every type of audit event the portal writes, as one enumeration.

An event type is always a member of `Event`, never a string built at run time, so each place that
writes one can be found by its name. The values are what `AuditEvent.action` stores and what the
API's `action` filter matches: keep them as they are, since rows already written hold them.
"""

from __future__ import annotations

from enum import StrEnum


class Event(StrEnum):
    # Users and groups (apps/accounts)
    USER_CREATE = "user.create"
    USER_UPDATE = "user.update"
    USER_DEACTIVATE = "user.deactivate"
    GROUP_CREATE = "group.create"
    GROUP_UPDATE = "group.update"
    GROUP_DELETE = "group.delete"
    SIGN_IN = "signin.success"
    SIGN_IN_FAILED = "signin.failure"  # no actor; the target is the username that was tried
    TOKEN_CREATE = "token.create"
    TOKEN_REVOKE = "token.revoke"

    # Workspaces, memberships, quotas and cohorts (apps/workspaces)
    WORKSPACE_CREATE = "workspace.create"
    WORKSPACE_UPDATE = "workspace.update"
    WORKSPACE_DELETE = "workspace.delete"
    WORKSPACE_UNIX_ACCOUNT = "workspace.unix_account"
    MEMBERSHIP_SET = "membership.set"
    MEMBERSHIP_REMOVE = "membership.remove"
    INVITATION_CREATE = "invitation.create"
    INVITATION_RESEND = "invitation.resend"
    INVITATION_WITHDRAW = "invitation.withdraw"
    INVITATION_ACCEPT = "invitation.accept"
    COLLABORATOR_SET = "collaborator.set"
    COLLABORATOR_REMOVE = "collaborator.remove"
    QUOTA_SET = "quota.set"
    QUOTA_DELETE = "quota.delete"
    COHORT_CREATE = "cohort.create"
    COHORT_UPDATE = "cohort.update"
    COHORT_DELETE = "cohort.delete"

    # Profiles (apps/catalog): the values are the models' names
    COMPUTE_PROFILE_CREATE = "computeprofile.create"
    COMPUTE_PROFILE_UPDATE = "computeprofile.update"
    COMPUTE_PROFILE_PUBLISH = "computeprofile.publish"
    COMPUTE_PROFILE_DELETE = "computeprofile.delete"
    NOTEBOOK_PROFILE_CREATE = "notebookprofile.create"
    NOTEBOOK_PROFILE_UPDATE = "notebookprofile.update"
    NOTEBOOK_PROFILE_PUBLISH = "notebookprofile.publish"
    NOTEBOOK_PROFILE_DELETE = "notebookprofile.delete"
    INFERENCE_PROFILE_CREATE = "inferenceprofile.create"
    INFERENCE_PROFILE_UPDATE = "inferenceprofile.update"
    INFERENCE_PROFILE_PUBLISH = "inferenceprofile.publish"
    INFERENCE_PROFILE_DELETE = "inferenceprofile.delete"

    # Clusters (apps/inventory)
    CLUSTER_CREATE = "cluster.create"
    CLUSTER_UPDATE = "cluster.update"
    CLUSTER_DELETE = "cluster.delete"
    CLUSTER_DISCOVER = "cluster.discover"
    # Node maintenance (apps/inventory/maintenance.py): cordoned, drain asked for, drain done, back in
    # service; maintenance windows announced, changed, withdrawn, begun and ended
    NODE_CORDON = "node.cordon"
    NODE_DRAIN = "node.drain"
    NODE_DRAINED = "node.drained"
    NODE_UNCORDON = "node.uncordon"
    MAINTENANCE_CREATE = "maintenance.create"
    MAINTENANCE_UPDATE = "maintenance.update"
    MAINTENANCE_DELETE = "maintenance.delete"
    MAINTENANCE_START = "maintenance.start"
    MAINTENANCE_END = "maintenance.end"
    # Elastic node pools (apps/elastic): a pool's scaling limits set, or its scaling removed
    ELASTIC_SET = "elastic.set"
    ELASTIC_DELETE = "elastic.delete"

    # Instances (apps/compute, apps/scheduling): asked for by a user, then done by the portal
    INSTANCE_LAUNCH = "instance.launch"
    INSTANCE_UPDATE = "instance.update"
    INSTANCE_DELETE = "instance.delete"
    INSTANCE_ADMIT = "instance.admit"
    INSTANCE_START = "instance.start"
    INSTANCE_RESTART = "instance.restart"
    INSTANCE_FAIL = "instance.fail"
    INSTANCE_DELETED = "instance.deleted"  # its processes are gone; INSTANCE_DELETE is the request
    INSTANCE_CULL = "instance.cull"  # deleted by the portal: idle, or past its workspace's maximum runtime
    INSTANCE_IDLE_WARNING = "instance.idle_warning"  # its user told it will be deleted for being idle

    # Notebooks (apps/compute)
    NOTEBOOK_LAUNCH = "notebook.launch"
    NOTEBOOK_UPDATE = "notebook.update"
    NOTEBOOK_DELETE = "notebook.delete"
    NOTEBOOK_OPEN = "notebook.open"
    NOTEBOOK_READY = "notebook.ready"
    NOTEBOOK_FAIL = "notebook.fail"
    NOTEBOOK_STOPPED = "notebook.stopped"
    NOTEBOOK_IDLE_WARNING = "notebook.idle_warning"  # its user told it will be stopped for being idle
    NOTEBOOK_CULL = "notebook.cull"  # stopped by the portal: idle, or past its maximum runtime
    NOTEBOOK_START = "notebook.start"  # a stopped notebook started again

    # Jobs (apps/jobs, apps/scheduling); a job's end is named by its state, in lowercase
    JOB_SUBMIT = "job.submit"
    JOB_CANCEL = "job.cancel"
    JOB_ADMIT = "job.admit"
    JOB_START = "job.start"
    JOB_PREEMPT = "job.preempt"
    JOB_REQUEUE = "job.requeue"
    JOB_SUCCEEDED = "job.succeeded"
    JOB_FAILED = "job.failed"
    JOB_ARTIFACTS_LEFT_OUT = "job.artifacts_left_out"  # by the portal: files past the artifact limits

    # Ray clusters (apps/rayclusters, apps/scheduling): asked for by a user, then done by the portal
    RAY_CREATE = "raycluster.create"
    RAY_DELETE = "raycluster.delete"
    RAY_OPEN = "raycluster.open"  # a user signed in to its dashboard from the portal
    RAY_ADMIT = "raycluster.admit"
    RAY_READY = "raycluster.ready"
    RAY_DEGRADED = "raycluster.degraded"
    RAY_REPAIRED = "raycluster.repaired"
    RAY_PREEMPT = "raycluster.preempt"
    RAY_REQUEUE = "raycluster.requeue"
    RAY_SUCCEEDED = "raycluster.succeeded"
    RAY_FAILED = "raycluster.failed"
    RAY_STOPPED = "raycluster.stopped"
    # Inference endpoints (apps/inference)
    ENDPOINT_CREATE = "endpoint.create"
    ENDPOINT_UPDATE = "endpoint.update"
    ENDPOINT_DELETE = "endpoint.delete"
    ENDPOINT_READY = "endpoint.ready"
    ENDPOINT_SCALE = "endpoint.scale"
    ENDPOINT_ADMIT = "endpoint.admit"  # a replica was admitted
    ENDPOINT_PREEMPT = "endpoint.preempt"  # a replica was preempted
    ENDPOINT_REPLICA_FAILED = "endpoint.replica_failed"
    ENDPOINT_FAILED = "endpoint.failed"
    # GPU provisioning requests (apps/provisioning)
    GPR_REQUEST = "gpr.request"
    GPR_APPROVE = "gpr.approve"
    GPR_REJECT = "gpr.reject"
    GPR_MODIFY = "gpr.modify"
    GPR_CANCEL = "gpr.cancel"
    GPR_RELEASE = "gpr.release"
    GPR_BEGIN = "gpr.begin"
    GPR_END = "gpr.end"
    GPR_POLICY_SET = "gpr.policy_set"

    # What-if replays (apps/scheduling/whatif.py): an admin's replay of the portal's history
    WHATIF_START = "whatif.start"

    # Alerts (apps/alerts): rules changed by users; alerts silenced, firing and resolved
    ALERT_RULE_CREATE = "alertrule.create"
    ALERT_RULE_UPDATE = "alertrule.update"
    ALERT_RULE_DELETE = "alertrule.delete"
    ALERT_RULE_SILENCE = "alertrule.silence"
    ALERT_SILENCE = "alert.silence"
    ALERT_FIRE = "alert.fire"  # by the portal: a rule's condition held for its `for_s`
    ALERT_RESOLVE = "alert.resolve"  # by the portal: the condition of a firing alert stopped holding


# A job's end, by the state it ends in (a value of Job.State): a new final state needs its event.
JOB_ENDS = {"SUCCEEDED": Event.JOB_SUCCEEDED, "FAILED": Event.JOB_FAILED}
