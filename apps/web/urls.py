from django.urls import path

from apps.web import (
    cli_login,
    dashboard,
    home,
    instances,
    invitations,
    jobs,
    members,
    notebooks,
    signin,
    sso,
    telemetry,
    tokens,
)
from apps.web.usage_report import usage_report

app_name = "web"

urlpatterns = [
    path("", home.landing, name="landing"),
    path("login/", signin.SignIn.as_view(), name="login"),
    path("logout/", sso.sign_out, name="logout"),
    path("sso/start/", sso.SsoStart.as_view(), name="sso-start"),
    path("sso/callback/", sso.SsoCallback.as_view(), name="sso-callback"),
    path("switch/", home.switch, name="switch"),
    path("tokens/", tokens.tokens, name="tokens"),
    path("cli-login/", cli_login.cli_login, name="cli-login"),
    path("invitations/<str:secret>/", invitations.invitation, name="invitation"),
    path("w/<str:ws>/", dashboard.dashboard, name="dashboard"),
    path("w/<str:ws>/usage.json", dashboard.usage_data, name="usage"),
    path("w/<str:ws>/usage/report/", usage_report, name="usage-report"),
    path("w/<str:ws>/instances/", instances.instance_list, name="instances"),
    path("w/<str:ws>/instances/new/", instances.instance_new, name="instance-new"),
    path("w/<str:ws>/instances/<int:pk>/", instances.instance_detail, name="instance"),
    path("w/<str:ws>/instances/<int:pk>/gpu.json", telemetry.instance_gpu, name="instance-gpu"),
    path("w/<str:ws>/instances/<int:pk>/describe/", instances.instance_describe, name="instance-describe"),
    path("w/<str:ws>/instances/<int:pk>/delete/", instances.instance_delete, name="instance-delete"),
    path("w/<str:ws>/instances/<int:pk>/kubeconfig/", instances.instance_kubeconfig, name="instance-kubeconfig"),
    path(
        "w/<str:ws>/instances/<int:pk>/collaborators/",
        instances.instance_collaborators,
        name="instance-collaborators",
    ),
    path("w/<str:ws>/notebooks/", notebooks.notebook_list, name="notebooks"),
    path("w/<str:ws>/notebooks/new/", notebooks.notebook_new, name="notebook-new"),
    path("w/<str:ws>/notebooks/<int:pk>/", notebooks.notebook_detail, name="notebook"),
    path("w/<str:ws>/notebooks/<int:pk>/gpu.json", telemetry.notebook_gpu, name="notebook-gpu"),
    path("w/<str:ws>/notebooks/<int:pk>/delete/", notebooks.notebook_delete, name="notebook-delete"),
    path("w/<str:ws>/notebooks/<int:pk>/start/", notebooks.notebook_start, name="notebook-start"),
    path("w/<str:ws>/jobs/", jobs.job_list, name="jobs"),
    path("w/<str:ws>/jobs/new/", jobs.job_new, name="job-new"),
    path("w/<str:ws>/jobs/<int:pk>/", jobs.job_detail, name="job"),
    path("w/<str:ws>/jobs/<int:pk>/gpu.json", telemetry.job_gpu, name="job-gpu"),
    path("w/<str:ws>/jobs/<int:pk>/cancel/", jobs.job_cancel, name="job-cancel"),
    path("w/<str:ws>/members/", members.members, name="members"),
]
