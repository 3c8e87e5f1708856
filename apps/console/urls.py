from django.urls import path

from apps.console import alerts, catalog, dashboard, people, usage, whatif, workspaces

app_name = "console"

urlpatterns = [
    path("", dashboard.dashboard, name="dashboard"),
    path("usage.json", dashboard.usage_data, name="usage"),
    path("inventory/", dashboard.inventory, name="inventory"),
    path("inventory/gpus/<int:pk>/", dashboard.gpu_detail, name="gpu"),
    path("inventory/gpus/<int:pk>/samples.json", dashboard.gpu_samples, name="gpu-samples"),
    path("usage/", usage.usage, name="usage-report"),
    path("whatif/", whatif.whatif_page, name="whatif"),
    path("whatif/<int:pk>/", whatif.whatif_run, name="whatif-run"),
    path("whatif/<int:pk>/csv/", whatif.whatif_csv, name="whatif-csv"),
    path("alerts/", alerts.alert_list, name="alerts"),
    path("alerts/rules/new/", alerts.rule_edit, name="alert-rule-new"),
    path("alerts/rules/<int:pk>/", alerts.rule_edit, name="alert-rule"),
    path("alerts/rules/<int:pk>/delete/", alerts.rule_delete, name="alert-rule-delete"),
    path("alerts/rules/<int:pk>/silence/", alerts.rule_silence, name="alert-rule-silence"),
    path("alerts/<int:pk>/silence/", alerts.alert_silence, name="alert-silence"),
    path("profiles/", catalog.profile_list, name="profiles"),
    path("profiles/<str:kind>/new/", catalog.profile_edit, name="profile-new"),
    path("profiles/<str:kind>/<str:name>/", catalog.profile_edit, name="profile"),
    path("profiles/<str:kind>/<str:name>/publish/", catalog.profile_publish, name="profile-publish"),
    path("workspaces/", workspaces.workspace_list, name="workspaces"),
    path("workspaces/new/", workspaces.workspace_edit, name="workspace-new"),
    path("workspaces/<str:name>/", workspaces.workspace_edit, name="workspace"),
    path("workspaces/<str:name>/quotas/", workspaces.quota_set, name="quota-set"),
    path("workspaces/<str:name>/quotas/<str:gpu_type>/delete/", workspaces.quota_delete, name="quota-delete"),
    path("cohorts/", workspaces.cohort_create, name="cohort-create"),
    path("cohorts/<str:name>/delete/", workspaces.cohort_delete, name="cohort-delete"),
    path("people/", people.people, name="people"),
    path("people/users/new/", people.user_edit, name="user-new"),
    path("people/users/<str:username>/", people.user_edit, name="user"),
    path("people/users/<str:username>/deactivate/", people.user_deactivate, name="user-deactivate"),
    path("people/groups/", people.group_create, name="group-create"),
    path("people/groups/<str:name>/delete/", people.group_delete, name="group-delete"),
]
