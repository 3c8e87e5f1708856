from django.contrib import admin

from apps.inventory.models import GPU, Allocation, Cluster, Node, NodePool


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "is_default", "enabled", "discovered_at"]


@admin.register(NodePool)
class NodePoolAdmin(admin.ModelAdmin):
    list_display = ["name", "cluster"]


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "pool", "cpu_cores", "memory_gb", "state"]
    list_filter = ["state"]


@admin.register(GPU)
class GPUAdmin(admin.ModelAdmin):
    list_display = ["node", "index", "gpu_type", "model", "memory_mb", "declared"]
    list_filter = ["gpu_type", "declared"]


@admin.register(Allocation)
class AllocationAdmin(admin.ModelAdmin):
    list_display = ["gpu", "fraction", "workload", "podset", "replica", "created_at"]
