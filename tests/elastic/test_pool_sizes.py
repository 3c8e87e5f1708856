"""Elastic pools' size over time: the autoscaler's runs store a sample when a pool's counts change (and at most
once a minute when they do not), samples older than the telemetry's retention are dropped, and the admin's
cluster dashboard charts each pool's nodes over the window against its minimum and maximum, from the samples."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from apps.elastic import scaling
from apps.elastic.models import PoolScaling, PoolSizeSample
from apps.inventory.actions import do_save_cluster
from apps.inventory.models import GPU, Cluster, Node, NodePool
from tests.personas import World

pytestmark = pytest.mark.django_db


@pytest.fixture
def pool() -> PoolScaling:
    """Cluster burst (Slurm, scaled by a command that is never run here): b1 up, b2 and b3 powered down."""
    burst = do_save_cluster(Cluster(), {"name": "burst", "kind": "slurm", "connection": {"partition": "elastic"}},
                            acting_user=None)  # fmt: skip
    pool = NodePool.objects.create(cluster=burst, name="elastic")
    for name, state in (("b1", "ready"), ("b2", "powered_down"), ("b3", "powered_down")):
        node = Node.objects.create(pool=pool, name=name, cpu_cores=64, memory_gb=512, state=state)
        GPU.objects.bulk_create(GPU(node=node, index=i, gpu_type="h100", model="H100") for i in range(4))
    return PoolScaling.objects.create(pool=pool, provider="command", command="/bin/true", min_nodes=1, max_nodes=3)


def samples() -> list[tuple[int, int, int, int, int]]:
    return [s.counts for s in PoolSizeSample.objects.order_by("at", "id")]


def test_a_sample_is_stored_when_the_counts_change_and_at_most_once_a_minute_otherwise(pool: PoolScaling) -> None:
    now = timezone.now()
    scaling.upkeep(now)
    assert samples() == [(1, 0, 0, 2, 0)]
    scaling.upkeep(now + timedelta(seconds=20))
    scaling.upkeep(now + timedelta(seconds=40))
    assert len(samples()) == 1  # nothing changed, within the minute
    Node.objects.filter(name="b2").update(state=Node.State.POWERING_UP)
    scaling.upkeep(now + timedelta(seconds=45))
    assert samples()[-1] == (1, 1, 0, 1, 0)  # changed: at once
    scaling.upkeep(now + timedelta(seconds=110))
    assert len(samples()) == 3 and samples()[-1] == (1, 1, 0, 1, 0)  # a minute on: the line goes on


def test_samples_older_than_the_retention_are_dropped(pool: PoolScaling) -> None:
    now = timezone.now()
    old = PoolSizeSample.objects.create(pool=pool.pool, at=now - scaling.SIZE_RETENTION - timedelta(hours=1), ready=1)
    kept = PoolSizeSample.objects.create(pool=pool.pool, at=now - scaling.SIZE_RETENTION + timedelta(hours=1), ready=1)
    assert scaling.prune_sizes(now, force=True) == 1
    assert list(PoolSizeSample.objects.values_list("pk", flat=True)) == [kept.pk]
    assert not PoolSizeSample.objects.filter(pk=old.pk).exists()


def test_the_dashboard_charts_each_pools_size_against_its_limits(world: World, pool: PoolScaling) -> None:
    now = timezone.now()
    for minutes, (ready, starting) in ((50, (1, 0)), (30, (1, 2)), (28, (3, 0)), (5, (1, 0))):
        PoolSizeSample.objects.create(pool=pool.pool, at=now - timedelta(minutes=minutes), ready=ready,
                                      starting=starting, powered_down=3 - ready - starting)  # fmt: skip
    client = Client()
    client.force_login(world.admin)
    page = client.get("/console/")
    assert page.status_code == 200
    html = page.content.decode()
    url = f"/console/elastic/{pool.pool_id}/size.json?window=1h"
    assert f'data-chart-url="{url}"' in html and "burst / elastic" in html
    assert "minimum 1, maximum 3" in html

    data = client.get(url).json()
    assert len(data["labels"]) == 60
    up, starting = data["series"]["nodes up"], data["series"]["starting"]
    assert set(data["series"]) == {"nodes up", "starting"}  # lines that stayed at 0 are left out
    assert up[:9] == [None] * 9  # before the first sample: not known
    assert up[10] == 1 and max(v for v in up if v is not None) == 3 and up[-1] == 1
    assert up[31] == 3 and starting[30] == 2 and starting[33] == 0  # the two minutes of starting
    assert data["limits"] == {"nodes up": 3} and data["floors"] == {"nodes up": 1}


def test_the_pools_chart_is_for_admins_only(world: World, pool: PoolScaling) -> None:
    client = Client()
    client.force_login(world.alice)
    assert client.get(f"/console/elastic/{pool.pool_id}/size.json").status_code in (403, 404)
    assert "size.json" not in client.get("/").content.decode()
    admin = Client()
    admin.force_login(world.admin)
    assert admin.get("/console/elastic/999999/size.json").status_code == 404
