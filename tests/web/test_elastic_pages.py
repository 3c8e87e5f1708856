"""The console's Elastic pools page: for platform admins only; each elastic pool with its nodes' states
and since when, the month's GPU-hours against its budget, its last decisions and a chart of its size
over the last day rebuilt from them; the limits' form (and Make elastic for a static pool), checked
as the API checks them and audited as changes from the web."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.console.elastic import WINDOW, _values, size_history
from apps.elastic.models import NodePower, PoolScaling, ScalingDecision
from apps.inventory.actions import do_save_cluster
from apps.inventory.models import GPU, Cluster, Node, NodePool
from tests.personas import World
from tests.web.conftest import queries

pytestmark = pytest.mark.django_db
SignedIn = Callable[[Any], Client]
PAGE = "/console/elastic/"


@pytest.fixture
def pool() -> NodePool:
    """Cluster burst (Slurm): b1 up for a day, b2 starting for 3 minutes, b3 failed to start; 4 h100 each."""
    burst = do_save_cluster(Cluster(), {"name": "burst", "kind": "slurm", "connection": {"partition": "elastic"}},
                            acting_user=None)  # fmt: skip
    pool = NodePool.objects.create(cluster=burst, name="elastic")
    now = timezone.now()
    for name, state, ago in (("b1", "ready", None), ("b2", "powering_up", 3), ("b3", "failed", 20)):
        node = Node.objects.create(pool=pool, name=name, cpu_cores=64, memory_gb=512, state=state)
        GPU.objects.bulk_create(GPU(node=node, index=i, gpu_type="h100", model="H100") for i in range(4))
        if ago is not None:
            NodePower.objects.create(node=node, changed_at=now - timedelta(minutes=ago))
    return pool


def elastic(pool: NodePool, **limits: Any) -> PoolScaling:
    values = {"min_nodes": 1, "max_nodes": 3, "budget_gpu_hours": 100, "used_gpu_hours": 12.5,
              "budget_month": f"{timezone.now():%Y-%m}", **limits}  # fmt: skip
    return PoolScaling.objects.create(pool=pool, **values)


def decide(pool: NodePool, minutes_ago: float, action: str, nodes: list[str], reason: str, error: str = "") -> None:
    decision = ScalingDecision.objects.create(pool=pool, action=action, nodes=nodes, reason=reason, error=error)
    ScalingDecision.objects.filter(pk=decision.pk).update(at=timezone.now() - timedelta(minutes=minutes_ago))


def test_the_page_and_its_forms_are_for_platform_admins_only(world: World, signed_in: SignedIn, pool: NodePool) -> None:
    elastic(pool)
    for user in (world.alice, world.victor):
        client = signed_in(user)
        assert client.get(PAGE).status_code == 403
        assert client.post(f"{PAGE}{pool.pk}/", {"max_nodes": "1", "provider": "slurm"}).status_code == 403
        assert client.post(f"{PAGE}{pool.pk}/delete/").status_code == 403
    assert Client().get(PAGE).status_code == 302  # signed out: to the sign-in page
    assert PoolScaling.objects.get(pool=pool).max_nodes == 3
    assert signed_in(world.admin).get(PAGE).status_code == 200
    assert 'href="/console/elastic/"' in signed_in(world.admin).get("/console/").content.decode()


def test_it_shows_each_pools_nodes_budget_decisions_and_size(world: World, signed_in: SignedIn, pool: NodePool) -> None:
    elastic(pool)
    decide(pool, 120, "up", ["b2", "b3"], "adding 2 nodes (b2, b3) to h100 on burst for 1 pending workload of team-a")
    decide(
        pool, 20, "failed", ["b3"], "b3 did not start within 600 s: no work goes there", "the scaling command failed"
    )
    decide(pool, 3, "up", ["b2"], "adding 1 node (b2) to h100 on burst for 1 pending workload of team-a")
    html = signed_in(world.admin).get(PAGE).content.decode()

    section, local = html.split('data-pool="local/default"')  # pools by cluster: burst, then local
    section = section[section.index('data-pool="burst/elastic"') :]
    assert re.search(r'data-node="b1">.*?data-state="ready">Ready<', section, re.S)
    assert re.search(r'data-node="b2">.*?data-state="powering_up">Powering up<.*?<time datetime=', section, re.S)
    assert re.search(r'data-node="b3">.*?data-state="failed">Failed to start<', section, re.S)
    assert "12.5 of 100" in section and 'max="100" value="12.50"' in section
    reasons = re.findall(r'<td data-label="Reason" class="reason">([^<]*)</td>', section)
    assert [r[:20] for r in reasons] == ["adding 1 node (b2) t", "b3 did not start wit", "adding 2 nodes (b2, "]
    assert '<span class="field-error">the scaling command failed</span>' in section
    assert "Nodes up over the last 24 hours: 0 to 2, 2 now" in section
    assert 'value="3"' in section and "Save limits" in section  # the form holds the limits
    assert "Not elastic" in local and "Make elastic" in local and "<svg" not in local


def test_the_size_over_the_day_is_rebuilt_from_the_decisions(pool: NodePool) -> None:
    """Now 2 up. Newest first: a start of b2 (+1), a failed start of b3 (-1), a stop whose provider
    failed (nothing changed), a stop of b1 (-1), a start of b2 and b3 (+2)."""
    now = timezone.now()
    for minutes, action, nodes, error in ((600, "up", ["b2", "b3"], ""), (300, "down", ["b1"], ""),
                                          (200, "down", ["b2"], "no answer"), (20, "failed", ["b3"], ""),
                                          (3, "up", ["b2"], "")):  # fmt: skip
        decide(pool, minutes, action, nodes, "why", error)
    recent = list(ScalingDecision.objects.order_by("-at", "-id"))
    steps = size_history(2, recent, now - WINDOW, 3)
    assert [size for _, size in steps] == [1, 3, 2, 2, 1, 2]
    assert steps[0][0] == now - WINDOW and [at for at, _ in steps[1:]] == [d.at for d in reversed(recent)]
    # What no decision says (the cluster brought nodes back) stays within the pool.
    assert [size for _, size in size_history(3, recent[:1], now - WINDOW, 3)] == [2, 3]
    assert [size for _, size in size_history(0, recent[:2], now - WINDOW, 3)] == [1, 0, 0]


def test_an_admin_makes_a_pool_elastic_changes_it_and_makes_it_static(
    world: World, signed_in: SignedIn, pool: NodePool
) -> None:
    Node.objects.filter(pool=pool).update(state=Node.State.READY)
    admin = signed_in(world.admin)
    form = {"provider": "slurm", "command": "", "min_nodes": "0", "max_nodes": "2", "scale_down_delay_s": "900",
            "start_timeout_s": "300", "budget_gpu_hours": "", "enabled": "on"}  # fmt: skip
    made = admin.post(f"{PAGE}{pool.pk}/", form)
    assert made.status_code == 302 and made["Location"] == f"{PAGE}#pool-{pool.pk}"
    scaling = PoolScaling.objects.get(pool=pool)
    assert (scaling.max_nodes, scaling.scale_down_delay_s, scaling.start_timeout_s, scaling.budget_gpu_hours) == (
        2, 900, 300, None,
    )  # fmt: skip
    assert AuditEvent.objects.filter(action="elastic.set", via=AuditEvent.Via.WEB, actor=world.admin).exists()

    refused = admin.post(f"{PAGE}{pool.pk}/", {**form, "max_nodes": "5", "start_timeout_s": "2"})
    assert refused.status_code == 400
    html = refused.content.decode()
    assert re.search(
        rf'id="p{pool.pk}-start_timeout_s-error"><p class="field-error">Ensure this value is greater', html
    )
    assert f'id="id_p{pool.pk}_start_timeout_s" name="start_timeout_s" type="number" value="2"' in html
    refused = admin.post(f"{PAGE}{pool.pk}/", {**form, "max_nodes": "5", "budget_gpu_hours": "40"})
    assert f'id="p{pool.pk}-max_nodes-error"><p class="field-error">Pool burst/elastic has 3 nodes' in (
        refused.content.decode()
    )
    assert PoolScaling.objects.get(pool=pool).max_nodes == 2

    admin.post(f"{PAGE}{pool.pk}/", {**form, "budget_gpu_hours": "40", "enabled": ""})
    scaling.refresh_from_db()
    assert (scaling.budget_gpu_hours, scaling.enabled) == (40, False)

    Node.objects.filter(name="b2").update(state=Node.State.POWERED_DOWN)
    kept = admin.post(f"{PAGE}{pool.pk}/delete/", follow=True)
    assert "b2 (powered down)" in kept.content.decode() and PoolScaling.objects.filter(pool=pool).exists()
    Node.objects.filter(name="b2").update(state=Node.State.READY)
    admin.post(f"{PAGE}{pool.pk}/delete/")
    assert not PoolScaling.objects.exists()
    assert AuditEvent.objects.filter(action="elastic.delete", via=AuditEvent.Via.WEB).exists()


def test_it_costs_the_same_queries_however_many_decisions_and_nodes(
    world: World, signed_in: SignedIn, pool: NodePool
) -> None:
    elastic(pool)
    admin = signed_in(world.admin)
    decide(pool, 5, "up", ["b2"], "why")
    few = queries(admin, PAGE)
    for i in range(60):
        decide(pool, i * 20, "up" if i % 2 else "down", ["b1"], f"why {i}")
    for i in range(4, 10):
        Node.objects.create(pool=pool, name=f"b{i}", state=Node.State.POWERED_DOWN)
    assert queries(admin, PAGE) == few


def test_a_static_pools_form_starts_from_its_clusters_own_provider() -> None:
    expected = {"slurm": "slurm", "kubernetes": "kubernetes", "local": "command"}
    for kind, provider in expected.items():
        cluster = Cluster.objects.create(name=f"c-{kind}", kind=kind)
        pool = NodePool.objects.create(cluster=cluster, name="p")
        assert _values(pool, None, 2)["provider"] == provider
