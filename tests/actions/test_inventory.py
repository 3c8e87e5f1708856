"""Discovering this machine's GPUs: NVML where there is one, the declared inventory elsewhere."""

from __future__ import annotations

import socket
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.audit.models import AuditEvent
from apps.inventory import discovery
from apps.inventory.actions import do_sync_local_cluster
from apps.inventory.discovery import GPUInfo, gpu_type_from_model, parse_declared
from apps.inventory.models import GPU, Allocation, Cluster, Node
from apps.jobs.actions import check_submit_job
from apps.names import GPU_TYPE_RE
from apps.scheduling.adapter import run_cycle
from tests.personas import World


def test_it_parses_a_declared_inventory() -> None:
    gpus = parse_declared("2xh100")

    assert gpus == [
        GPUInfo(0, "h100", "NVIDIA H100 80GB HBM3", 81559, "Hopper", declared=True),
        GPUInfo(1, "h100", "NVIDIA H100 80GB HBM3", 81559, "Hopper", declared=True),
    ]


def test_it_numbers_the_gpus_of_several_declared_types_in_turn() -> None:
    gpus = parse_declared(" 2xA100, 1xt4 ,1xmi300,")

    assert [(g.index, g.gpu_type, g.model, g.memory_mb) for g in gpus] == [
        (0, "a100", "NVIDIA A100-SXM4-80GB", 81920),
        (1, "a100", "NVIDIA A100-SXM4-80GB", 81920),
        (2, "t4", "Tesla T4", 15360),
        (3, "mi300", "MI300", 0),
    ]


def test_it_declares_nothing_for_an_empty_spec() -> None:
    assert parse_declared("") == []


def test_it_declares_gpu_types_it_does_not_know() -> None:
    assert [(g.gpu_type, g.model) for g in parse_declared("1xh100x")] == [("h100x", "H100X")]


@pytest.mark.parametrize("spec", ["h100", "8", "8x", "xh100", "8 x h100", "-1xh100", "8xh100-", "8x-h100", "8xh_100"])
def test_it_refuses_a_bad_declared_inventory(spec: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_declared(spec)

    assert str(info.value) == f"PORTAL_DECLARED_GPUS item {spec.strip().lower()!r}: expected COUNTxTYPE, e.g. 8xh100"


@pytest.mark.parametrize(
    "model, gpu_type",
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L40", "l40"),
        ("NVIDIA L4", "l4"),
        ("Tesla V100-SXM2-32GB", "v100"),
        ("Tesla T4", "t4"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA RTX A6000", "rtx-a6000"),
        ("Quadro RTX 8000", "rtx-8000"),
        ("NVIDIA TITAN V", "titan-v"),
        ("NVIDIA-H100-80GB-HBM3", "h100"),  # as Kubernetes nodes' nvidia.com/gpu.product labels write them
        ("NVIDIA-GeForce-RTX-4090", "rtx-4090"),
        ("Tesla-T4", "t4"),
        ("", "gpu"),
        ("NVIDIA " + "x" * 31 + "-yz", "x" * 31),
    ],
)
def test_it_names_a_gpu_type_after_its_model(model: str, gpu_type: str) -> None:
    assert gpu_type_from_model(model) == gpu_type


@settings(max_examples=200, deadline=None, database=None)
@given(st.text(max_size=80) | st.from_regex(r"(NVIDIA |Tesla )?[A-Za-z0-9 _.-]{0,60}", fullmatch=True))
def test_it_names_a_valid_gpu_type_after_any_model(model: str) -> None:
    assert GPU_TYPE_RE.match(gpu_type_from_model(model))


# --- syncing the local cluster --------------------------------------------------------------


def local_gpus() -> list[tuple[int, str]]:
    return list(GPU.objects.filter(node__pool__cluster__name="local").values_list("index", "gpu_type"))


def test_it_registers_this_machine_as_the_default_local_cluster(db: None) -> None:
    cluster = do_sync_local_cluster(parse_declared("2xa100"))

    assert (cluster.name, cluster.kind, cluster.is_default) == ("local", Cluster.Kind.LOCAL, True)
    assert cluster.discovered_at is not None
    node = Node.objects.get(pool__cluster=cluster)
    assert (node.name, node.state) == (socket.gethostname(), Node.State.READY)
    assert local_gpus() == [(0, "a100"), (1, "a100")]
    assert all(GPU.objects.values_list("declared", flat=True))
    [event] = AuditEvent.objects.filter(action="cluster.discover")
    assert event.data == {"gpus": 2, "declared": True, "created": True}


def test_it_syncs_again_without_duplicates(world: World) -> None:
    do_sync_local_cluster(parse_declared("8xh100"))

    assert Cluster.objects.count() == 1
    assert Node.objects.count() == 1
    assert local_gpus() == [(i, "h100") for i in range(8)]


def test_it_leaves_a_second_cluster_the_default(db: None) -> None:
    Cluster.objects.create(name="slurm", kind=Cluster.Kind.SLURM, is_default=True)

    assert do_sync_local_cluster(parse_declared("1xh100")).is_default is False


def test_it_removes_vanished_gpus_unless_a_workload_holds_them(world: World) -> None:
    job = check_submit_job(
        world.team_a, name="t", command="c", gpu_type="h100", gpus_per_replica=Decimal(1), acting_user=world.alice
    )
    run_cycle()
    [held] = Allocation.objects.filter(workload=job).values_list("gpu__index", flat=True)
    survivors = {0, 1, held}

    do_sync_local_cluster(parse_declared("2xh100"))

    assert {index for index, _ in local_gpus()} == survivors
    assert Allocation.objects.filter(workload=job).count() == 1


def test_it_uses_the_declared_inventory_where_nvml_finds_no_gpu(db: None, settings: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(discovery, "nvml_gpus", lambda: None)
    settings.PORTAL_DECLARED_GPUS = "4xl4"

    do_sync_local_cluster()

    assert local_gpus() == [(i, "l4") for i in range(4)]


def test_it_refuses_a_bad_declared_inventory_in_settings(db: None, settings: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(discovery, "nvml_gpus", lambda: None)
    settings.PORTAL_DECLARED_GPUS = "eight h100"

    with pytest.raises(ValueError, match="PORTAL_DECLARED_GPUS item 'eight h100': expected COUNTxTYPE"):
        do_sync_local_cluster()
    assert not Cluster.objects.exists()
