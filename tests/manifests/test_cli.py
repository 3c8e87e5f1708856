"""`gpuportal apply`, `diff` and `export` against a live embedded portal, with their exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from gpuportal import Client

from tests.sdk.conftest import LivePortal, Run

pytestmark = pytest.mark.slow

PROFILES = """\
apiVersion: gpuportal.io/v1
kind: ComputeProfile
metadata: {name: cli-gpu}
spec: {gpu_type: h100, gpu_count: 1, cpu_cores: 8, memory_gb: 32, published: true}
---
apiVersion: gpuportal.io/v1
kind: NotebookProfile
metadata: {name: cli-nb}
spec: {image: "quay.io/jupyter/minimal-notebook", python_packages: [jupyterlab]}
"""
WORKSPACES = """\
apiVersion: gpuportal.io/v1
kind: Cohort
metadata: {name: cli-cohort}
spec: {description: From the command line}
---
apiVersion: gpuportal.io/v1
kind: Workspace
metadata: {name: cli-team}
spec:
  cohort: cli-cohort
  max_instances: 2
  allowed_profiles: [cli-gpu]
  gpu_quotas: [{gpu_type: h100, gpus: 2}]
---
apiVersion: gpuportal.io/v1
kind: AlertRule
metadata: {name: cli-team queue}
spec:
  kind: queue_wait
  workspace: cli-team
  threshold: 900
  webhook_url: http://127.0.0.1:9/hook
  webhook_secret_from: {env: CLI_TEAM_WEBHOOK_SECRET}
"""


def write(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def test_an_admin_manages_the_platform_as_manifests(
    live_portal: LivePortal, cli: Run, cli_env: dict[str, str], tmp_path: Path
) -> None:
    platform = write(tmp_path / "platform", {"profiles.yaml": PROFILES, "workspaces.yaml": WORKSPACES})
    cli_env["CLI_TEAM_WEBHOOK_SECRET"] = "a-shared-secret-of-32-characters"

    # The demo user is no admin: refused, and nothing is applied.
    refused = cli("apply", "-f", "platform")
    assert (refused.returncode, refused.stderr.strip()) == (1, "Error: Only platform admins can do this.")

    admin = Client.login(live_portal.url, "admin", live_portal.passwords["admin"])
    cli_env["GPUPORTAL_TOKEN"] = str(admin.token)
    planned = cli("diff", "-f", "platform")
    assert planned.returncode == 1, planned.stderr
    assert "+ ComputeProfile cli-gpu: created" in planned.stdout.splitlines()
    assert planned.stdout.splitlines()[-1] == "5 created, 0 changed, 0 deleted, 0 unchanged (would be)."

    applied = cli("apply", "-f", "platform")
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.splitlines()[-1] == "5 created, 0 changed, 0 deleted, 0 unchanged: applied."
    rule = next(r for r in admin.request("GET", "alert-rules/")["results"] if r["name"] == "cli-team queue")
    assert rule["webhook_secret_set"] is True

    again = cli("apply", "-f", "platform")
    assert (again.returncode, again.stdout.strip()) == (0, "0 created, 0 changed, 0 deleted, 5 unchanged: applied.")
    assert cli("diff", "-f", "platform").returncode == 0

    # One refused document anywhere: nothing applied, the file, document and field named.
    (platform / "profiles.yaml").write_text(
        PROFILES.replace("cpu_cores: 8", "cpu_cores: 12").replace(
            '"quay.io/jupyter/minimal-notebook"', '"not an image"'
        )
    )
    failed = cli("apply", "-f", "platform")
    assert failed.returncode == 1
    assert failed.stderr.startswith(
        "Error: platform/profiles.yaml, document 2 (NotebookProfile cli-nb): spec.image: An image reference is"
    ), failed.stderr
    assert failed.stderr.strip().endswith("Nothing was applied.")
    assert admin.request("GET", "compute-profiles/cli-gpu/")["cpu_cores"] == 8
    assert cli("diff", "-f", "platform").returncode == 2

    (platform / "profiles.yaml").write_text(PROFILES.replace("cpu_cores: 8", "cpu_cores: 12"))
    changed = cli("diff", "-f", "platform")
    assert changed.returncode == 1
    assert changed.stdout.splitlines()[:2] == ["~ ComputeProfile cli-gpu: changed", "    spec.cpu_cores: 8 -> 12"]
    assert cli("apply", "-f", "platform").returncode == 0
    assert admin.request("GET", "compute-profiles/cli-gpu/")["cpu_cores"] == 12

    # The export is what was applied; the webhook's secret is named, never written.
    exported = cli("export", "-o", "export.yaml")
    assert exported.returncode == 0, exported.stderr
    documents = list(yaml.safe_load_all((tmp_path / "export.yaml").read_text()))
    by_name = {(d["kind"], d["metadata"]["name"]): d["spec"] for d in documents}
    assert by_name[("ComputeProfile", "cli-gpu")]["cpu_cores"] == 12
    assert by_name[("Workspace", "cli-team")]["gpu_quotas"][0]["gpus"] == "2.00"
    rule_spec = by_name[("AlertRule", "cli-team queue")]
    assert rule_spec["webhook_secret_from"] == {"env": "GPUPORTAL_WEBHOOK_SECRET_CLI_TEAM_QUEUE"}
    assert "a-shared-secret" not in (tmp_path / "export.yaml").read_text()


def test_a_secret_in_a_manifest_is_refused_before_anything_is_sent(
    live_portal: LivePortal, cli: Run, cli_env: dict[str, str], tmp_path: Path
) -> None:
    cli_env["GPUPORTAL_TOKEN"] = str(Client.login(live_portal.url, "admin", live_portal.passwords["admin"]).token)
    inline = WORKSPACES.replace(
        "webhook_secret_from: {env: CLI_TEAM_WEBHOOK_SECRET}", "webhook_secret: hunter2hunter2hunter2"
    )
    write(tmp_path / "inline", {"workspaces.yaml": inline})
    refused = cli("apply", "-f", "inline")
    assert refused.returncode == 1
    assert refused.stderr.startswith("Error: inline/workspaces.yaml, document 3 (AlertRule cli-team queue): "
                                     "spec.webhook_secret: a secret is never written in a manifest")  # fmt: skip

    write(tmp_path / "broken", {"a.yaml": "kind: [\n"})
    broken = cli("apply", "-f", "broken")
    assert broken.returncode == 1
    assert broken.stderr.startswith("Error: broken/a.yaml, line 2: not YAML: expected the node content")
    assert cli("diff", "-f", "broken").returncode == 2

    write(tmp_path / "unset", {"workspaces.yaml": WORKSPACES})
    unset = cli("apply", "-f", "unset")
    assert unset.returncode == 1
    assert "the environment variable CLI_TEAM_WEBHOOK_SECRET is not set" in unset.stderr

    token = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZG1pbiJ9.c2lnbmF0dXJl"
    cluster = f"apiVersion: gpuportal.io/v1\nkind: Cluster\nmetadata: {{name: k8s-x}}\n" \
              f"spec: {{kind: kubernetes, connection: {{host: 'https://k8s:6443', bearer: '{token}'}}}}\n"  # fmt: skip
    write(tmp_path / "clusters", {"c.yaml": cluster})
    refused = cli("apply", "-f", "clusters/c.yaml")
    assert refused.returncode == 1
    assert refused.stderr.startswith("Error: clusters/c.yaml, document 1 (Cluster k8s-x): spec.connection.bearer: "
                                     "A credential is never written in a manifest")  # fmt: skip
    assert not [c for c in Client.login(live_portal.url, "admin", live_portal.passwords["admin"])
                .request("GET", "clusters/")["results"] if c["name"] == "k8s-x"]  # fmt: skip


def test_prune_deletes_what_a_folder_no_longer_names(
    live_portal: LivePortal, cli: Run, cli_env: dict[str, str], tmp_path: Path
) -> None:
    cli_env["GPUPORTAL_TOKEN"] = str(Client.login(live_portal.url, "admin", live_portal.passwords["admin"]).token)
    cohort = "apiVersion: gpuportal.io/v1\nkind: Cohort\nmetadata: {{name: {}}}\n"
    folder = write(tmp_path / "cohorts", {"a.yaml": cohort.format("prune-a"), "b.yaml": cohort.format("prune-b")})
    assert cli("apply", "-f", "cohorts").returncode == 0
    (folder / "b.yaml").unlink()

    planned = cli("apply", "-f", "cohorts", "--prune", "--dry-run")
    assert planned.returncode == 0, planned.stderr
    assert "- Cohort prune-b: deleted" in planned.stdout.splitlines()
    pruned = cli("apply", "-f", "cohorts", "--prune")
    assert pruned.returncode == 0, pruned.stderr
    assert "- Cohort prune-b: deleted" in pruned.stdout.splitlines()
    assert cli("diff", "-f", "cohorts", "--prune").returncode == 0
