"""An environment build says what it does to the start that waits for it (workers/backends/steps.py):
built earlier, or being built by someone else since when and for how long it usually takes, from
the durations of the earlier builds kept beside the environments."""

from __future__ import annotations

import fcntl
import json
import threading
import time
from pathlib import Path

from workers.backends import pyenv
from workers.backends.steps import ENVIRONMENT, StartSteps


def test_the_expected_duration_is_the_median_of_the_earlier_builds_of_the_same_packages(tmp_path: Path) -> None:
    assert pyenv.expected_build_s(tmp_path, "env:pandas") is None  # none yet: nothing to go by
    for seconds in (30.0, 50.0, 40.0):
        pyenv._record_build(tmp_path, "env:pandas", seconds)
    pyenv._record_build(tmp_path, "sdk", 5.0)
    assert pyenv.expected_build_s(tmp_path, "env:pandas") == 40.0
    assert pyenv.expected_build_s(tmp_path, "sdk") == 5.0
    kept = json.loads((tmp_path / pyenv.BUILDS_FILE).read_text())
    assert [entry["seconds"] for entry in kept["env:pandas"]] == [30.0, 50.0, 40.0]


def test_an_environment_built_earlier_says_so(tmp_path: Path) -> None:
    env = tmp_path / "sdk-0123"
    (env).mkdir()
    (env / ".ready").write_text("")
    steps = StartSteps()
    build = pyenv._Build("sdk", [], "", what="the portal's SDK on this machine's Python")
    assert pyenv._ensure(env, "python3", [], system_site_packages=True, build=build, steps=steps) == env
    [step] = steps.snapshot()
    assert step["step"] == ENVIRONMENT and "ready" in step["detail"] and "s ago" in step["detail"], step["detail"]


def test_a_start_that_finds_the_build_under_way_waits_for_it_and_says_whose_it_is(tmp_path: Path) -> None:
    env = tmp_path / "0123abcd"
    for seconds in (38.0, 42.0):
        pyenv._record_build(tmp_path, "env:jupyterlab", seconds)
    with open(tmp_path / f"{env.name}.lock", "w") as lock:  # the portal's build holds it
        fcntl.flock(lock, fcntl.LOCK_EX)
        began = time.time() - 12
        (tmp_path / f"{env.name}.building.json").write_text(json.dumps({"started_at": began, "by": "the portal"}))
        steps = StartSteps()
        build = pyenv._Build("env:jupyterlab", ["jupyterlab"], "")
        waiter = threading.Thread(
            target=pyenv._ensure, args=(env, "python3", ["jupyterlab"]),
            kwargs={"system_site_packages": False, "build": build, "steps": steps},
        )  # fmt: skip
        waiter.start()
        deadline = time.monotonic() + 10
        while not steps.snapshot() and time.monotonic() < deadline:
            time.sleep(0.02)
        [step] = steps.snapshot()
        assert step["step"] == ENVIRONMENT and step["ended_at"] is None
        assert "started 12 s ago by the portal, usually 40 s" in step["detail"], step["detail"]
        assert step["expected_s"] == 40.0 and step["packages"] == ["jupyterlab"]
        assert waiter.is_alive()  # it waits for the build, not making its own

        env.mkdir()  # the portal's build completes
        (env / ".ready").write_text("")
        fcntl.flock(lock, fcntl.LOCK_UN)
    waiter.join(10)
    assert not waiter.is_alive()
    assert len(steps.snapshot()) == 1  # nothing built by the waiter


def test_a_wait_met_again_is_one_step_and_a_new_step_ends_the_one_before() -> None:
    steps = StartSteps()
    steps.begin("queued", "waiting for a provisioning worker to build the environment")
    steps.finish()
    assert steps.reopen("queued", "waiting for a provisioning worker to build the environment")
    assert not steps.reopen("queued", "something else")
    steps.begin(ENVIRONMENT, "building")
    first, second = steps.snapshot()
    assert first["ended_at"] is not None and first["ended_at"] <= second["started_at"]
    assert second["ended_at"] is None
