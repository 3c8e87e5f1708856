from __future__ import annotations

from decimal import Decimal

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, Group
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from apps.names import validate_dns_label, validate_gpu_type


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

    class Meta(Profile.Meta):
        constraints = [
            models.CheckConstraint(
                condition=Q(gpu_count=0, gpu_type="") | (Q(gpu_count__gt=0) & ~Q(gpu_type="")),
                name="compute_profile_gpu_type_with_gpus",
            )
        ]

    @property
    def size_label(self) -> str:
        gpus = f"{self.gpu_count.normalize():f} x {self.gpu_type}, " if self.gpu_count else ""
        return f"{gpus}{self.cpu_cores} CPU, {self.memory_gb} GB"


class NotebookProfile(Profile):
    image = models.CharField(max_length=300, help_text="Container image for the Kubernetes backend.")
    python_packages = models.JSONField(
        default=list, blank=True, help_text="pip requirements of the local backend's environment."
    )
