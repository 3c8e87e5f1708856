import secrets
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand
from django.db import transaction

from apps.catalog.models import ComputeProfile, InferenceProfile, NotebookProfile
from apps.inventory.actions import do_sync_local_cluster
from apps.workspaces.actions import ensure_private_workspace
from apps.workspaces.models import GPUQuota, Membership, Role, Workspace

COMPUTE_PROFILES = [
    ("cpu-small", "CPU only, for data preparation", "", "0", 2, 8, "slice"),
    ("gpu-quarter", "A quarter of one H100, for notebooks and debugging", "h100", "0.25", 4, 16, "slice"),
    ("gpu-1", "One H100", "h100", "1", 8, 64, "slice"),
    ("gpu-4", "Four H100 on one node", "h100", "4", 32, 256, "slice"),
    ("gpu-8", "A whole 8 x H100 node", "h100", "8", 64, 512, "dedicated"),
]

# What the pages call each profile, as written here (a name's own words, not its slug title-cased).
DISPLAY_NAMES = {
    "cpu-small": "CPU small",
    "gpu-quarter": "Quarter of an H100",
    "gpu-1": "1 H100",
    "gpu-4": "4 H100",
    "gpu-8": "8 H100, a whole node",
    "minimal": "Minimal",
    "data-science": "Data science",
    "spark": "Spark",
    "tensorflow": "TensorFlow",
    "llama-cpu": "llama.cpp on CPU",
    "vllm-1": "vLLM on 1 H100",
}

#: Inference endpoints' profiles (docs/inference.md): (name, description, server, GPUs, CPU, memory).
INFERENCE_PROFILES = [
    (
        "llama-cpu",
        "GGUF models on CPU: small and quantised models, 4 requests at once a replica",
        "llamacpp",
        "",
        "0",
        2,
        8,
    ),
    ("vllm-1", "Hugging Face models on one H100 with vLLM's continuous batching", "vllm", "h100", "1", 8, 64),
]

NOTEBOOK_PROFILES = [
    ("minimal", "Python and JupyterLab", "quay.io/jupyter/minimal-notebook:2025-10-20",
     ["jupyterlab==4.4.10"]),
    ("data-science", "pandas, scikit-learn, matplotlib", "quay.io/jupyter/scipy-notebook:2025-10-20",
     ["jupyterlab==4.4.10", "pandas", "scikit-learn", "matplotlib"]),
    ("spark", "PySpark", "quay.io/jupyter/pyspark-notebook:2025-10-20", ["jupyterlab==4.4.10", "pyspark"]),
    ("tensorflow", "TensorFlow", "quay.io/jupyter/tensorflow-notebook:2025-10-20",
     ["jupyterlab==4.4.10", "tensorflow"]),
]  # fmt: skip


class Command(BaseCommand):
    help = "Seed the demo: an admin, a demo team and user, profiles, the local cluster. Safe to run again."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--quiet-passwords", action="store_true", help="Do not print generated passwords.")

    def handle(self, *args: Any, quiet_passwords: bool = False, **options: Any) -> None:
        with transaction.atomic():
            logins = [
                self._user("admin", staff=True),
                self._user("demo", staff=False),
            ]
            self._team()
            self._profiles()
        cluster = do_sync_local_cluster()
        gpus = sum(node.gpus.count() for pool in cluster.pools.all() for node in pool.nodes.all())
        self.stdout.write(f"Local cluster: {gpus} GPUs")
        for username, password in logins:
            if quiet_passwords:
                continue
            if password:
                self.stdout.write(f"Login: {username} / {password}  (one-time: shown until first sign-in)")
            else:
                self.stdout.write(f"Login: {username} (password unchanged since it was first used)")

    def _user(self, username: str, *, staff: bool) -> tuple[str, str | None]:
        """Create the user, or give a never-used account a fresh password to print."""
        User = get_user_model()
        user, created = User.objects.get_or_create(
            username=username, defaults={"is_staff": staff, "is_superuser": staff, "email": f"{username}@localhost"}
        )
        if not created and user.last_login is not None:
            return username, None
        password = secrets.token_urlsafe(12)
        user.set_password(password)
        user.save()
        ensure_private_workspace(user)
        return username, password

    def _team(self) -> None:
        User = get_user_model()
        team, _ = Group.objects.get_or_create(name="demo-team")
        demo = User.objects.get(username="demo")
        demo.groups.add(team)
        workspace, created = Workspace.objects.get_or_create(
            name="demo-team",
            defaults={
                "display_name": "Demo team",
                "description": "The demo team's shared workspace.",
                "assignee_kind": Workspace.Assignee.TEAM,
                "assigned_group": team,
                "max_instances": 8,
                "max_notebooks": 8,
                "cpu_cores": 128,
                "memory_gb": 1024,
            },
        )
        if created:
            GPUQuota.objects.create(workspace=workspace, gpu_type="h100", gpus=Decimal("4"))
            Membership.objects.create(workspace=workspace, user=demo, role=Role.OWNER)

    def _profiles(self) -> None:
        for name, description, gpu_type, gpus, cpu, memory, kind in COMPUTE_PROFILES:
            ComputeProfile.objects.get_or_create(
                name=name,
                defaults={
                    "display_name": DISPLAY_NAMES[name],
                    "description": description,
                    "gpu_type": gpu_type,
                    "gpu_count": Decimal(gpus),
                    "cpu_cores": cpu,
                    "memory_gb": memory,
                    "kind": kind,
                    "published": True,
                },
            )
        for name, description, server, gpu_type, gpus, cpu, memory in INFERENCE_PROFILES:
            InferenceProfile.objects.get_or_create(
                name=name,
                defaults={
                    "display_name": DISPLAY_NAMES[name],
                    "description": description,
                    "server": server,
                    "gpu_type": gpu_type,
                    "gpus": Decimal(gpus),
                    "cpu_cores": cpu,
                    "memory_gb": memory,
                    "concurrency": 4 if server == "llamacpp" else 32,
                    "published": True,
                },
            )
        for name, description, image, packages in NOTEBOOK_PROFILES:
            NotebookProfile.objects.get_or_create(
                name=name,
                defaults={
                    "display_name": DISPLAY_NAMES[name],
                    "description": description,
                    "image": image,
                    "python_packages": packages,
                    "published": True,
                },
            )
