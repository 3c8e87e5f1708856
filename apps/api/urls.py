from django.urls import include, path
from rest_framework.routers import DefaultRouter

from apps.accounting.api import UsageView
from apps.accounts.api import (
    ApiTokenViewSet,
    DeviceLoginView,
    DeviceTokenView,
    GroupViewSet,
    MeView,
    TokenView,
    UserViewSet,
)
from apps.alerts.api import AlertRuleViewSet, AlertViewSet
from apps.audit.api import AuditEventViewSet, AuditExportView
from apps.catalog.api import ComputeProfileViewSet, NotebookProfileViewSet
from apps.compute.api import CollaboratorViewSet, InstanceViewSet, NotebookViewSet
from apps.elastic.api import PoolScalingViewSet
from apps.inference.api import EndpointViewSet, InferenceProfileViewSet
from apps.inventory.api import ClusterViewSet, GPUViewSet, MaintenanceWindowViewSet, NodeViewSet
from apps.invitations.api import InvitationViewSet
from apps.jobs.api import JobViewSet
from apps.manifests.api import ManifestsView
from apps.provisioning.api import GPRCalendarView, GPREstimateView, GPRViewSet
from apps.provisioning.policy_api import ProvisioningPolicyViewSet
from apps.rayclusters.api import RayClusterViewSet
from apps.scheduling.api import WhatIfCSVView, WhatIfDetailView, WhatIfListView
from apps.workloads.api import WorkloadViewSet
from apps.workspaces.api import CohortViewSet, GPUQuotaViewSet, MembershipViewSet, WorkspaceViewSet

router = DefaultRouter()
router.register("workspaces", WorkspaceViewSet, basename="workspace")
router.register("memberships", MembershipViewSet, basename="membership")
router.register("invitations", InvitationViewSet, basename="invitation")
router.register("quotas", GPUQuotaViewSet, basename="quota")
router.register("cohorts", CohortViewSet, basename="cohort")
router.register("compute-profiles", ComputeProfileViewSet, basename="computeprofile")
router.register("notebook-profiles", NotebookProfileViewSet, basename="notebookprofile")
router.register("inference-profiles", InferenceProfileViewSet, basename="inferenceprofile")
router.register("endpoints", EndpointViewSet, basename="endpoint")
router.register("instances", InstanceViewSet, basename="instance")
router.register("notebooks", NotebookViewSet, basename="notebook")
router.register("collaborators", CollaboratorViewSet, basename="collaborator")
router.register("jobs", JobViewSet, basename="job")
router.register("ray-clusters", RayClusterViewSet, basename="raycluster")
router.register("workloads", WorkloadViewSet, basename="workload")
router.register("clusters", ClusterViewSet, basename="cluster")
router.register("nodes", NodeViewSet, basename="node")
router.register("maintenance-windows", MaintenanceWindowViewSet, basename="maintenancewindow")
router.register("gpus", GPUViewSet, basename="gpu")
router.register("pool-scaling", PoolScalingViewSet, basename="poolscaling")
router.register("audit-events", AuditEventViewSet, basename="auditevent")
router.register("users", UserViewSet, basename="user")
router.register("groups", GroupViewSet, basename="group")
router.register("alert-rules", AlertRuleViewSet, basename="alertrule")
router.register("alerts", AlertViewSet, basename="alert")
router.register("gprs", GPRViewSet, basename="gpr")

urlpatterns = [
    path("me/", MeView.as_view(), name="me"),
    path("auth/token/", TokenView.as_view(), name="token"),
    path("auth/device/", DeviceLoginView.as_view(), name="device-login"),
    path("auth/device/token/", DeviceTokenView.as_view(), name="device-token"),
    # A user's own tokens: not a tenant's objects (tests/api/test_tokens.py checks their isolation).
    path("tokens/", ApiTokenViewSet.as_view({"get": "list", "post": "create"}), name="apitoken-list"),
    path(
        "tokens/<int:pk>/",
        ApiTokenViewSet.as_view({"get": "retrieve", "delete": "destroy"}),
        name="apitoken-detail",
    ),
    # Before the router's audit-events/<pk>/, which would take "export" for an id.
    path("audit-events/export/", AuditExportView.as_view(), name="auditevent-export"),
    # GPU-hours per month, workspace, user and GPU type: a report, not a list of objects.
    path("usage/", UsageView.as_view(), name="usage"),
    # Admins' what-if replays of the portal's history: runs, not tenant objects (tests/scheduling/test_whatif_api.py).
    path("admin/whatif/", WhatIfListView.as_view(), name="whatif-list"),
    path("admin/whatif/<int:pk>/", WhatIfDetailView.as_view(), name="whatif-detail"),
    path("admin/whatif/<int:pk>/csv/", WhatIfCSVView.as_view(), name="whatif-csv"),
    # The platform as manifests: export and apply, admins only (tests/manifests/).
    path("admin/manifests/", ManifestsView.as_view(), name="manifests"),
    # Before the router's gprs/<pk>/: an estimate saves nothing, and the calendar shows every
    # workspace's reservations with only what the queue shows (tests/provisioning/test_api.py).
    path("gprs/estimate/", GPREstimateView.as_view(), name="gpr-estimate"),
    path("gprs/calendar/", GPRCalendarView.as_view(), name="gpr-calendar"),
    path(
        "gpr-policies/<str:workspace>/",
        ProvisioningPolicyViewSet.as_view({"get": "retrieve", "put": "update", "patch": "partial_update"}),
        name="gpr-policy",
    ),
    path("", include(router.urls)),
]
