"""Sizes read the same in the API (and so in the CLI, which prints its `size` fields), in the SDK's
summaries and on the pages: "1 × H100, 8 CPU, 64 GB", never "1 x h100"."""

from __future__ import annotations

from decimal import Decimal

from gpuportal.models import gpus_of as sdk_gpus_of
from gpuportal.models import on_replicas

from apps.catalog.models import InferenceProfile
from apps.sizes import gpus_of
from apps.web.templatetags.portal import size
from tests.personas import World


def test_the_profiles_api_writes_sizes_as_the_pages_do(world: World) -> None:
    InferenceProfile.objects.create(name="vllm-1", server="vllm", gpu_type="h100", gpus=Decimal(1), cpu_cores=8,
                                    memory_gb=64, published=True)  # fmt: skip
    client = world.client(world.alice)

    compute = {p["name"]: p["size"] for p in client.get("/api/v1/compute-profiles/").json()["results"]}
    inference = {p["name"]: p["size"] for p in client.get("/api/v1/inference-profiles/").json()["results"]}

    assert compute["gpu-1"] == "1 × H100, 8 CPU, 64 GB" == size(world.gpu_1)
    assert compute["cpu-small"] == "2 CPU, 8 GB"
    assert inference["vllm-1"] == "1 × H100, 8 CPU, 64 GB"


def test_the_sdk_writes_gpus_as_the_portal_does() -> None:
    for count, gpu_type in ((Decimal("1"), "h100"), (Decimal("0.250"), "h100"), (Decimal("8.00"), "a100-80gb")):
        assert sdk_gpus_of(count, gpu_type) == gpus_of(count, gpu_type)
    assert on_replicas("1 × H100", 1) == "1 × H100"
    assert on_replicas("1 × H100", 2) == "1 × H100 on each of 2 replicas"
