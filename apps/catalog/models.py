from __future__ import annotations

from decimal import Decimal

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, Group
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from apps.names import validate_dns_label, validate_gpu_type
from apps.sizes import size_text
from apps.workloads.models import PriorityClass


class VisibleQuerySet(models.QuerySet):
    def visible_to(self, user: AbstractBaseUser | AnonymousUser) -> VisibleQuerySet:
        """Published profiles open to everyone or to one of the user's groups; admins see all."""
        if getattr(user, "is_staff", False):
            return self
        if not user.is_authenticated:
            return self.none()
        open_ids = self.filter(published=True).filter(
            Q(visible_to__isnull=True) | Q(visible_to__in=user.groups.all())  # type: ignore[attr-defined]
        )
        return self.filter(pk__in=open_ids.values("pk"))


class Profile(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[validate_dns_label])
    display_name = models.CharField(max_length=200, blank=True)
    description = models.CharField(max_length=2000, blank=True)
    published = models.BooleanField(default=False)
    visible_to = models.ManyToManyField(Group, blank=True, related_name="+", help_text="Empty: everyone.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = VisibleQuerySet.as_manager()

    class Meta:
        abstract = True
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ComputeProfile(Profile):
    class Kind(models.TextChoices):
        SLICE = "slice", "GPU slice of a node"
        NAMESPACE = "namespace", "Kubernetes namespace"
        VCLUSTER = "vcluster", "Virtual cluster"
        DEDICATED = "dedicated", "Dedicated nodes"

    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.SLICE)
    gpu_type = models.CharField(max_length=32, blank=True, validators=[validate_gpu_type])
    gpu_count = models.DecimalField(
        max_digits=7,
        decimal_places=3,
        default=Decimal("0"),
        validators=[MinValueValidator(Decimal("0")), MaxValueValidator(Decimal("1024"))],
    )
    cpu_cores = models.PositiveIntegerField(default=4, validators=[MinValueValidator(1), MaxValueValidator(4096)])
    memory_gb = models.PositiveIntegerField(default=16, validators=[MinValueValidator(1), MaxValueValidator(65536)])
    # The priority class of the instances launched from it (docs/scheduler.md).
    priority_class = models.CharField(max_length=16, choices=PriorityClass.choices, default=PriorityClass.INTERACTIVE)

    class Meta(Profile.Meta):
        constraints = [
            models.CheckConstraint(
                condition=Q(gpu_count=0, gpu_type="") | (Q(gpu_count__gt=0) & ~Q(gpu_type="")),
                name="compute_profile_gpu_type_with_gpus",
            )
        ]

    @property
    def size_label(self) -> str:
        return size_text(self.gpu_count, self.gpu_type, self.cpu_cores, self.memory_gb)


class NotebookProfile(Profile):
    image = models.CharField(max_length=300, help_text="Container image for the Kubernetes backend.")
    python_packages = models.JSONField(
        default=list, blank=True, help_text="pip requirements of the local backend's environment."
    )


class InferenceProfile(Profile):
    """What an inference endpoint's replicas run (workers/backends/servers.py): the server, its
    arguments, and one replica's size; and how its endpoints scale: how many requests one replica
    serves at once (more wait in the portal's proxy), how long requests wait before another
    replica is started, and how long a quieter endpoint waits before it stops one."""

    class Server(models.TextChoices):
        LLAMACPP = "llamacpp", "llama.cpp server (CPU)"
        VLLM = "vllm", "vLLM (GPU)"

    server = models.CharField(max_length=16, choices=Server.choices, default=Server.LLAMACPP)
    server_args = models.JSONField(default=list, blank=True, help_text="Extra arguments of the server.")
    image = models.CharField(max_length=300, blank=True, help_text="Container image for the Kubernetes backend.")
    gpu_type = models.CharField(max_length=32, blank=True, validators=[validate_gpu_type])
    gpus = models.DecimalField(
        max_digits=7,
        decimal_places=3,
        default=Decimal("0"),
        validators=[MinValueValidator(Decimal("0")), MaxValueValidator(Decimal("1024"))],
    )
    cpu_cores = models.PositiveIntegerField(default=2, validators=[MinValueValidator(1), MaxValueValidator(4096)])
    memory_gb = models.PositiveIntegerField(default=4, validators=[MinValueValidator(1), MaxValueValidator(65536)])
    concurrency = models.PositiveIntegerField(default=4, validators=[MinValueValidator(1), MaxValueValidator(1024)])
    scale_up_after_s = models.PositiveIntegerField(default=5, validators=[MaxValueValidator(3600)])
    scale_down_after_s = models.PositiveIntegerField(default=120, validators=[MaxValueValidator(86400)])
    # The priority class of its endpoints' minimum replicas (those above it are unattended work).
    priority_class = models.CharField(max_length=16, choices=PriorityClass.choices, default=PriorityClass.INFERENCE)

    class Meta(Profile.Meta):
        constraints = [
            models.CheckConstraint(
                condition=Q(gpus=0, gpu_type="") | (Q(gpus__gt=0) & ~Q(gpu_type="")),
                name="inference_profile_gpu_type_with_gpus",
            )
        ]

    @property
    def size_label(self) -> str:
        return size_text(self.gpus, self.gpu_type, self.cpu_cores, self.memory_gb)
