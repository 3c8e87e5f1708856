from django.contrib import admin

from apps.audit.models import AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ["created_at", "actor_name", "action", "target_repr", "workspace", "via", "ip_address"]
    list_filter = ["action", "via"]
    search_fields = ["target_repr", "actor_name"]

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False  # the trail is append-only
