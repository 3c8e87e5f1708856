"""How an elastic pool's nodes are started and stopped: Slurm's own power saving, the operator's
command, or the Kubernetes cluster autoscaler (a ProvisioningRequest: apps/elastic/kubernetes.py).
Each provider starts and stops named nodes and, where it can, says what power state each is in;
the autoscaler (apps/elastic/scaling.py) decides which."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Literal

from apps.elastic.models import PoolScaling
from workers.backends.base import BackendError

Power = Literal["up", "down", "powering_up", "powering_down", "failed"]
COMMAND_TIMEOUT_S = 600.0


def power_up(scaling: PoolScaling, nodes: Sequence[str]) -> None:
    if scaling.provider == PoolScaling.Provider.SLURM:
        from workers.backends import slurm_power

        slurm_power.resume(list(nodes))  # undrained (a node stopped earlier), or a failed start forgotten
        slurm_power.power_up(list(nodes))
    elif scaling.provider == PoolScaling.Provider.KUBERNETES:
        from apps.elastic import kubernetes

        kubernetes.power_up(scaling, nodes)
    else:
        _command(scaling, "up", nodes)


def reset(scaling: PoolScaling, nodes: Sequence[str]) -> None:
    """Forget a failed start, so that the nodes may be started again (Slurm: back in its count)."""
    if scaling.provider == PoolScaling.Provider.SLURM:
        from workers.backends import slurm_power

        slurm_power.resume(list(nodes))
    elif scaling.provider == PoolScaling.Provider.KUBERNETES:
        from apps.elastic import kubernetes

        kubernetes.reset(scaling, nodes)


def power_down(scaling: PoolScaling, nodes: Sequence[str]) -> None:
    """Stop nodes no work runs on (the caller made sure, and keeps work off them); on Slurm they are
    drained first, so that Slurm starts nothing there meanwhile either."""
    if scaling.provider == PoolScaling.Provider.SLURM:
        from workers.backends import slurm_power

        slurm_power.drain(list(nodes), "powered down by the portal's autoscaler")
        slurm_power.power_down(list(nodes))
    elif scaling.provider == PoolScaling.Provider.KUBERNETES:
        from apps.elastic import kubernetes

        kubernetes.power_down(scaling, nodes)
    else:
        _command(scaling, "down", nodes)


def observe(scaling: PoolScaling, nodes: Sequence[str]) -> dict[str, Power] | None:
    """Each node's power state as the cluster reports it; None where the provider cannot say (the
    operator's command: the portal's own record is all there is)."""
    if scaling.provider == PoolScaling.Provider.KUBERNETES:
        from apps.elastic import kubernetes

        return {name: _power(power) for name, power in kubernetes.observe(scaling, nodes).items()}
    if scaling.provider != PoolScaling.Provider.SLURM:
        return None
    from workers.backends import slurm_power

    found = slurm_power.node_power(list(nodes))
    return {name: _power(state.powered) for name, state in found.items()}


def failure(scaling: PoolScaling, node: str) -> str:
    """Why a node's start failed, where the provider says ('' where it does not: a start that timed out)."""
    if scaling.provider == PoolScaling.Provider.KUBERNETES:
        from apps.elastic import kubernetes

        return kubernetes.failure(scaling, node)
    return ""


def _power(powered: str) -> Power:
    return powered if powered in ("up", "down", "powering_up", "powering_down", "failed") else "failed"  # type: ignore[return-value]


def _command(scaling: PoolScaling, verb: str, nodes: Sequence[str]) -> None:
    """The operator's program: `<command> up|down <cluster> <pool> <node>...`, which returns once the
    nodes are up (or stopped); a non-zero exit is a failure, its output the reason."""
    if not scaling.command:
        raise BackendError(f"pool {scaling.pool} scales by command, but names none", permanent=True)
    argv = [scaling.command, verb, scaling.pool.cluster.name, scaling.pool.name, *nodes]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise BackendError(f"the scaling command {scaling.command} does not exist", permanent=True) from None
    except subprocess.TimeoutExpired:
        raise BackendError(
            f"the scaling command did not finish within {COMMAND_TIMEOUT_S:.0f} s", permanent=False
        ) from None
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip() or f"exit code {done.returncode}")[-500:]
        raise BackendError(f"the scaling command failed ({verb}): {said}", permanent=False)
