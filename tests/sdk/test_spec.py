"""Job specs are checked before they are sent: types, unknown fields, scripts, durations."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from gpuportal import JobSpec, SpecError
from gpuportal.spec import dns_label, parse_duration


def test_a_yaml_spec_becomes_the_jobs_request(tmp_path: Path) -> None:
    (tmp_path / "train.sh").write_text("#!/bin/bash\npython train.py\n")
    (tmp_path / "job.yaml").write_text(
        "name: train-resnet\nworkspace: team-a\nscript: train.sh\nenv: {EPOCHS: 10, DEBUG: false, LR: 0.1}\n"
        "gpus: 0.5\ngpu_type: h100\nreplicas: 4\npriority: -3\nmax_runtime: 1h30m\nartifacts: out/\n"
        "preemptible: false\ncluster: slurm-a\n"
    )
    body = JobSpec.load(tmp_path / "job.yaml").to_api()
    assert body == {
        "name": "train-resnet", "workspace": "team-a", "command": "#!/bin/bash\npython train.py\n", "image": "",
        "description": "", "env": {"EPOCHS": "10", "DEBUG": "false", "LR": "0.1"}, "gpus_per_replica": "0.5",
        "gpu_type": "h100", "replicas": 4, "priority": -3, "artifact_paths": ["out/"], "max_runtime_s": 5400,
        "preemptible": False, "cluster": "slurm-a",
    }  # fmt: skip


def test_the_apis_own_field_names_are_accepted_and_keywords_override_the_file(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text("script: run.sh\ngpus_per_replica: 2\nmax_runtime_s: 60\nartifact_paths: [a]\n")
    spec = JobSpec.load(tmp_path / "job.yaml", command="echo override", replicas=3)
    assert (spec.name, spec.command, spec.gpus, spec.max_runtime_s, spec.artifacts, spec.replicas) == (
        "job",
        "echo override",
        Decimal("2"),
        60,
        ["a"],
        3,
    )  # fmt: skip - named after the file; the command replaces the script, which is never read


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"name": "x", "command": "c", "replicas": "two"}, "replicas: should be a whole number, not text ('two')"),
        ({"name": "x", "command": "c", "replicas": 0}, "replicas: should be at least 1, not 0"),
        ({"name": "x", "command": "c", "replicas": True}, "replicas: should be a whole number, not true/false (True)"),
        ({"name": "x", "command": "c", "gpus": "lots"}, "gpus: should be a number of GPUs per replica (1, 8, 0.25)"),
        ({"name": "x", "command": "c", "gpus": -1}, "gpus: should be 0 or more, not -1"),
        ({"name": "x", "command": "c", "max_runtime": "soon"}, "max_runtime: should be seconds or a duration"),
        ({"name": "x", "command": "c", "env": ["A=1"]}, "env: should be a mapping of NAME: value, not a list"),
        ({"name": "x", "command": "c", "env": {"A": [1]}}, "env.A: should be text or a number, not a list ([1])"),
        ({"name": "x", "command": "c", "artifacts": [1]}, "artifacts: should be a list of paths"),
        ({"name": "x", "command": "c", "preemptible": "no"}, "preemptible: should be true or false, not text ('no')"),
        ({"name": "x", "command": "c", "replica": 2}, "replica: not a job spec field (did you mean 'replicas'?)"),
        ({"name": "x", "command": "c", "zzz": 2}, "zzz: not a job spec field; the fields are: name, workspace,"),
        ({"name": "x"}, "command: give the job a command or a script"),
        ({"name": "x", "command": "c", "script": "s.sh"}, "script: give either a command or a script, not both"),
        ({"command": "c"}, "name: required: use 1 to 63 lowercase letters"),
        ({"name": "My_Job", "command": "c"}, "name: 'My_Job' is not a name: use 1 to 63 lowercase letters"),
        ({"name": "x", "command": "c", "workspace": 3}, "workspace: should be text, not a number (3)"),
    ],
)
def test_a_bad_field_is_named_in_the_message(values: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError) as refused:
        JobSpec.load(values)
    assert str(refused.value).startswith(message), str(refused.value)


def test_a_script_is_read_relative_to_its_spec_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "job.yaml").write_text("script: missing.sh\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError, match=r"^jobs/job.yaml: script: no such file: .*/jobs/missing.sh$"):
        JobSpec.load("jobs/job.yaml")
    with pytest.raises(SpecError, match=r"^nope.yaml: no such file$"):
        JobSpec.load("nope.yaml")


def test_durations_and_names() -> None:
    assert [parse_duration(t) for t in ("90", "90s", "30m", "2h", "1d", "1h30m", "1.5h")] == [
        90, 90, 1800, 7200, 86400, 5400, 5400,
    ]  # fmt: skip
    for bad in ("", "h", "10 parsecs", "5m later"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    assert dns_label("Train_ResNet 50!") == "train-resnet-50"
