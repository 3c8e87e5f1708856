from django.contrib import admin

from apps.compute.models import Instance, Notebook


@admin.register(Instance)
class InstanceAdmin(admin.ModelAdmin):
    list_display = ["name", "workspace", "profile", "state", "created_at", "started_at"]
    list_filter = ["state", "profile"]
    search_fields = ["name", "workspace__name"]
    readonly_fields = ["created_at", "admitted_at", "started_at", "finished_at"]


@admin.register(Notebook)
class NotebookAdmin(admin.ModelAdmin):
    list_display = ["name", "workspace", "instance", "profile", "state", "created_at"]
    list_filter = ["state", "profile"]
    search_fields = ["name", "workspace__name"]
