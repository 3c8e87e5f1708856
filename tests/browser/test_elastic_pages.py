"""The console's Elastic pools page in a real browser, against the portal as it runs in production (see
conftest.py), at a desktop's and a phone's width: an elastic pool with a node up, one powered down and
one that failed to start, its GPU-hours against its budget, its last day's decisions and size as a
chart; a static pool with its Make elastic form. An admin's limits the pool cannot keep are refused
next to their field; good ones are saved. No Content-Security-Policy violation on the way (the chart
is an SVG the server draws: no inline style)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from apps.elastic.models import NodePower, PoolScaling, ScalingDecision
from apps.inventory.actions import do_save_cluster
from apps.inventory.models import GPU, Cluster, Node, NodePool
from tests.browser.conftest import Portal, sign_in
from tests.browser.test_rayclusters import at_both_widths, watch
from tests.personas import PASSWORD, World, make_world

pytestmark = pytest.mark.slow

HISTORY = [  # hours ago, action, nodes, reason, error
    (20, "up", ["b2", "b3"], "adding 2 nodes (b2, b3) to h100 on burst for 3 pending workloads of team-a", ""),
    (13, "down", ["b3"], "removing 1 node from h100 on burst: empty for 10 min, above the minimum of 1", ""),
    (4, "down", ["b2"], "removing 1 node from h100 on burst: empty for 10 min, above the minimum of 1", ""),
    (0.05, "up", ["b3"], "adding 1 node (b3) to h100 on burst for 1 pending workload of team-b",
     "the scaling command failed (up): no capacity in zone eu-west-1b"),
    (0.049, "failed", ["b3"], "could not start b3: the scaling command failed (up): no capacity in zone eu-west-1b",
     ""),
]  # fmt: skip


@pytest.fixture
def people(portal: Portal, tmp_path: Path) -> World:
    """The personas, and cluster burst's elastic pool: b1 up, b2 powered down, b3 failed to start a few
    minutes ago (tried again only after the hour's start timeout); scaled by an operator's program that
    is never asked anything here (no work waits, and empty nodes stop only after a week)."""
    world = make_world()
    script = tmp_path / "scale-pool"
    script.write_text('#!/bin/sh\necho "$@"\n')
    script.chmod(0o755)
    burst = do_save_cluster(Cluster(), {"name": "burst", "kind": "slurm", "connection": {"partition": "elastic"}},
                            acting_user=None)  # fmt: skip
    pool = NodePool.objects.create(cluster=burst, name="elastic")
    now = timezone.now()
    for name, state, hours in (("b1", "ready", 30), ("b2", "powered_down", 4), ("b3", "failed", 0.05)):
        node = Node.objects.create(pool=pool, name=name, cpu_cores=64, memory_gb=512, state=state)
        GPU.objects.bulk_create(GPU(node=node, index=i, gpu_type="h100", model="H100") for i in range(4))
        NodePower.objects.create(node=node, changed_at=now - timedelta(hours=hours))
    PoolScaling.objects.create(
        pool=pool, provider="command", command=str(script), min_nodes=1, max_nodes=3, scale_down_delay_s=7 * 86400,
        start_timeout_s=3600,
        budget_gpu_hours=200, used_gpu_hours=57.5, budget_month=f"{now:%Y-%m}", counted_at=now,
    )  # fmt: skip
    for hours, action, nodes, reason, error in HISTORY:
        made = ScalingDecision.objects.create(pool=pool, action=action, nodes=nodes, reason=reason, error=error)
        ScalingDecision.objects.filter(pk=made.pk).update(at=now - timedelta(hours=hours))
    return world


def test_an_admin_watches_and_sets_an_elastic_pool(page: Page, portal: Portal, people: World) -> None:
    problems: list[str] = []
    watch(page, problems)
    sign_in(page, portal.url, "admin", PASSWORD)
    page.goto(f"{portal.url}/console/")
    page.get_by_role("link", name="Elastic pools").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Elastic pools")
    pool = page.locator('[data-pool="burst/elastic"]')
    expect(pool.locator('[data-node="b2"] [data-state]')).to_have_text("Powered down")
    expect(pool.locator('[data-node="b3"] [data-state]')).to_have_text("Failed to start")
    expect(pool.get_by_text("57.5 of 200")).to_be_visible()
    expect(pool.get_by_role("img")).to_have_attribute("aria-label", "Nodes up over the last 24 hours: 1 to 3, 1 now; "
                                                      "the minimum is 1, the maximum 3, of 3 nodes.")  # fmt: skip
    expect(pool.locator('[data-label="Error"]').filter(has_text="no capacity in zone eu-west-1b")).to_be_visible()
    expect(page.locator('[data-pool="local/default"]').get_by_role("button", name="Make elastic")).to_be_visible()
    at_both_widths(page, "console-elastic")

    form = pool.get_by_role("form", name="Limits of burst/elastic")
    form.get_by_label("Maximum nodes").fill("5")
    form.get_by_role("button", name="Save limits").click()
    expect(pool.get_by_text("has 3 nodes in the inventory, and an elastic pool cannot start nodes")).to_be_visible()
    expect(pool.get_by_label("Maximum nodes")).to_have_attribute("aria-invalid", "true")
    at_both_widths(page, "console-elastic-refused")

    pool.get_by_label("Maximum nodes").fill("2")
    pool.get_by_label("GPU-hours a month").fill("300")
    pool.get_by_role("button", name="Save limits").click()
    expect(page.locator(".flash")).to_contain_text("Pool burst/elastic saved.")
    expect(pool.get_by_text("57.5 of 300")).to_be_visible()
    scaling = PoolScaling.objects.get(pool__name="elastic")
    assert (scaling.max_nodes, scaling.budget_gpu_hours) == (2, 300)
    assert problems == []
