from django.contrib import admin

from apps.catalog.models import ComputeProfile, NotebookProfile


@admin.register(ComputeProfile)
class ComputeProfileAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "gpu_type", "gpu_count", "cpu_cores", "memory_gb", "published"]
    list_filter = ["published", "kind", "gpu_type"]
    filter_horizontal = ["visible_to"]


@admin.register(NotebookProfile)
class NotebookProfileAdmin(admin.ModelAdmin):
    list_display = ["name", "image", "published"]
    list_filter = ["published"]
    filter_horizontal = ["visible_to"]
