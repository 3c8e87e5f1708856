from django.contrib import admin

from apps.workspaces.models import Cohort, GPUQuota, Membership, Workspace


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


class GPUQuotaInline(admin.TabularInline):
    model = GPUQuota
    extra = 0


@admin.register(Workspace)
class WorkspaceAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "assignee_kind", "cohort", "max_instances", "max_notebooks", "can_borrow"]
    list_filter = ["kind", "cohort", "can_borrow"]
    search_fields = ["name", "display_name"]
    inlines = [MembershipInline, GPUQuotaInline]
    filter_horizontal = ["allowed_profiles"]


@admin.register(Cohort)
class CohortAdmin(admin.ModelAdmin):
    list_display = ["name", "description"]
    search_fields = ["name"]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["workspace", "user", "role"]
    list_filter = ["role"]


@admin.register(GPUQuota)
class GPUQuotaAdmin(admin.ModelAdmin):
    list_display = ["workspace", "gpu_type", "gpus", "borrowing_limit", "lending_limit"]
    list_filter = ["gpu_type"]
