import os
import secrets
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand
from django.db import transaction

from apps.accounts import oidc
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


def login_lines(logins: list[tuple[str, str | None]]) -> list[str]:
    """What the start prints about signing in: each demo account's password until its first
    sign-in, and with single sign-on on, that it is on and which accounts still have a password."""
    lines = []
    if oidc.enabled():
        name = settings.PORTAL_OIDC_PROVIDER_NAME
        lines.append(f"Sign-in: single sign-on through {name} ({settings.PORTAL_OIDC_ISSUER}) is on.")
        keeper = settings.PORTAL_BREAK_GLASS_ADMIN
        if keeper:
            lines.append(f"Passwords: only {keeper} (PORTAL_BREAK_GLASS_ADMIN) still signs in with one.")
        else:
            lines.append("Passwords: off for every account (set PORTAL_BREAK_GLASS_ADMIN to keep one).")
    for username, password in logins:
        if not oidc.passwords_allowed_for(username):
            lines.append(f"Login: {username} through single sign-on only (its password is off)")
        elif password:
            lines.append(f"Login: {username} / {password}  (the same on every start until first sign-in)")
        else:
            lines.append(f"Login: {username} (password unchanged since first sign-in)")
    return lines


def _password_file(username: str) -> Path:
    """Where a demo account's password waits for its first sign-in: the data directory, readable
    by the portal's account alone."""
    return Path(settings.DATA_DIR) / "demo_passwords" / username


def _read_private(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)


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
        if not quiet_passwords:
            for line in login_lines(logins):
                self.stdout.write(line)

    def _user(self, username: str, *, staff: bool) -> tuple[str, str | None]:
        """Create the user, or give a never-used account its password to print: the one printed
        before while it still signs the account in, so that every start shows the same one until
        the account's first sign-in (then it is forgotten)."""
        User = get_user_model()
        user, created = User.objects.get_or_create(
            username=username, defaults={"is_staff": staff, "is_superuser": staff, "email": f"{username}@localhost"}
        )
        kept = _password_file(username)
        if not created and user.last_login is not None:
            kept.unlink(missing_ok=True)
            return username, None
        password = _read_private(kept)
        if created or not password or not user.check_password(password):
            password = secrets.token_urlsafe(12)
            user.set_password(password)
            user.save()
            _write_private(kept, password)
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
