from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.ci_skips import is_security_test, skip_fails

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "path",
    [
        "tests/security/test_sandbox.py",
        "/work/x/tests/security/deep/test_a.py",
        "tests/api/test_isolation.py",
        "tests/web/test_security_headers.py",
        "tests/security/test_hostile_workloads.py",
        "tests/web/test_collaborator_pages.py",
    ],
)
def test_it_knows_a_security_test(path: str) -> None:
    assert is_security_test(path)


@pytest.mark.parametrize(
    "path", ["tests/jobs/test_logs.py", "tests/scheduling/test_engine.py", "tests/web/test_pages.py"]
)
def test_it_knows_other_tests(path: str) -> None:
    assert not is_security_test(path)


def test_it_fails_a_security_skip_only_in_ci() -> None:
    assert skip_fails("tests/security/test_sandbox.py", {"CI": "true"})
    assert not skip_fails("tests/security/test_sandbox.py", {})
    assert not skip_fails("tests/jobs/test_logs.py", {"CI": "true"})


def test_it_turns_a_skip_under_tests_security_into_a_failure_in_ci(tmp_path: Path) -> None:
    """Runs pytest on a skipping test placed under a ``security`` folder, with the project's conftest."""
    folder = ROOT / "tests" / "security" / f"_probe_{tmp_path.name}"
    folder.mkdir()
    try:
        (folder / "__init__.py").write_text("")
        (folder / "test_probe.py").write_text(
            "import pytest\n\ndef test_needs_root():\n    pytest.skip('needs root')\n"
        )
        runs = {}
        for ci in ("true", ""):
            done = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", str(folder)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                env={**_environ(), "CI": ci},
                timeout=120,
                check=False,
            )
            runs[ci] = done
        assert runs["true"].returncode == 1, runs["true"].stdout
        assert "a security test may not skip in CI: needs root" in runs["true"].stdout
        assert runs[""].returncode == 0, runs[""].stdout
        assert "1 skipped" in runs[""].stdout
    finally:
        for path in sorted(folder.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        folder.rmdir()


def _environ() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
