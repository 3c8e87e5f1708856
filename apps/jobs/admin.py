from django.contrib import admin

from apps.jobs.models import Artifact, Job, JobAttempt


class JobAttemptInline(admin.TabularInline):
    model = JobAttempt
    extra = 0


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "workspace", "state", "gpu_type", "gpus_per_replica", "replicas", "priority",
                    "created_at"]  # fmt: skip
    list_filter = ["state", "gpu_type"]
    search_fields = ["name", "workspace__name"]
    inlines = [JobAttemptInline]


@admin.register(JobAttempt)
class JobAttemptAdmin(admin.ModelAdmin):
    list_display = ["job", "number", "outcome", "exit_code", "started_at", "finished_at"]


@admin.register(Artifact)
class ArtifactAdmin(admin.ModelAdmin):
    list_display = ["job", "path", "size_bytes", "created_at"]
