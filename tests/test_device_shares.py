"""The database never lets one GPU be shared above one device, whoever writes the allocations:
one transaction, or two at once on PostgreSQL (each sums what the other committed)."""

from __future__ import annotations

import threading
from decimal import Decimal

import pytest
from django.db import IntegrityError, connection, transaction

from apps.inventory.models import GPU, Allocation
from apps.jobs.actions import check_submit_job
from apps.jobs.models import Job
from tests.personas import World


def _job(world: World, name: str) -> Job:
    return check_submit_job(world.team_a, name=name, command="true", acting_user=world.alice)


def test_shares_of_one_gpu_above_one_are_refused(world: World) -> None:
    gpu = GPU.objects.order_by("pk").first()
    assert gpu is not None
    Allocation.objects.create(gpu=gpu, fraction=Decimal("0.75"), workload=_job(world, "a"))
    Allocation.objects.create(gpu=gpu, fraction=Decimal("0.25"), workload=_job(world, "b"))  # exactly one: fine
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.create(gpu=gpu, fraction=Decimal("0.25"), workload=_job(world, "c"))
    other = GPU.objects.exclude(pk=gpu.pk).order_by("pk").first()
    moving = Allocation.objects.create(gpu=other, fraction=Decimal("0.5"), workload=_job(world, "d"))
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.filter(pk=moving.pk).update(gpu=gpu)  # an update is checked too
    assert sum(a.fraction for a in Allocation.objects.filter(gpu=gpu)) == 1


def test_three_thirds_share_one_gpu_and_nothing_more_fits(world: World) -> None:
    gpu = GPU.objects.order_by("pk").first()
    assert gpu is not None
    for name in ("a", "b", "c"):
        Allocation.objects.create(gpu=gpu, fraction=Decimal("0.333"), workload=_job(world, name))
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.create(gpu=gpu, fraction=Decimal("0.25"), workload=_job(world, "d"))
    assert sum(a.fraction for a in Allocation.objects.filter(gpu=gpu)) == Decimal("0.999")
    other = GPU.objects.exclude(pk=gpu.pk).order_by("pk").first()
    assert other is not None
    Allocation.objects.create(gpu=other, fraction=Decimal("0.667"), workload=_job(world, "e"))
    Allocation.objects.create(gpu=other, fraction=Decimal("0.333"), workload=_job(world, "f"))  # exactly one
    assert sum(a.fraction for a in Allocation.objects.filter(gpu=other)) == 1


@pytest.mark.skipif(connection.vendor != "postgresql", reason="concurrent writers: PostgreSQL")
def test_two_transactions_at_once_cannot_overfill_a_gpu(tx_world: World) -> None:
    gpu = GPU.objects.order_by("pk").first()
    jobs = [_job(tx_world, f"j{n}") for n in range(2)]
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def take(job: Job) -> None:
        try:
            with transaction.atomic():
                barrier.wait(10)  # both inside a transaction before either writes
                Allocation.objects.create(gpu=gpu, fraction=Decimal("0.75"), workload=job)
            outcomes.append("took")
        except IntegrityError:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=take, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == ["refused", "took"]
    assert sum(a.fraction for a in Allocation.objects.filter(gpu=gpu)) == Decimal("0.75")


def test_an_admission_the_database_refuses_stays_queued_and_the_cycle_goes_on(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever the engine decides, a device is never given twice: the refused admission waits."""
    from apps.scheduling.adapter import run_cycle

    gpus = list(GPU.objects.filter(gpu_type="h100").order_by("pk"))
    first = check_submit_job(world.team_a, name="first", command="true", gpu_type="h100",
                             gpus_per_replica=Decimal("0.5"), acting_user=world.alice)  # fmt: skip
    # Someone else holds three quarters of every device, behind the scheduler's back (the snapshot
    # it reads says they are free).
    squatter = _job(world, "squatter")
    held = squatter.podsets.get()
    Allocation.objects.bulk_create(
        Allocation(gpu=g, fraction=Decimal("0.75"), workload=squatter, podset=held) for g in gpus
    )
    from apps.scheduling import adapter

    real = adapter.load_snapshot

    def stale() -> object:
        Allocation.objects.filter(workload=squatter).delete()
        try:
            return real()
        finally:
            Allocation.objects.bulk_create(
                Allocation(gpu=g, fraction=Decimal("0.75"), workload=squatter, podset=held) for g in gpus
            )

    monkeypatch.setattr(adapter, "load_snapshot", stale)
    run_cycle()
    first.refresh_from_db()
    assert first.state == Job.State.QUEUED
    assert not Allocation.objects.filter(workload=first).exists()
