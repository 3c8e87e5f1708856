from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.helm import ROOT

BUILD_STEPS = ROOT / "deploy" / "image" / "build-steps.sh"


@pytest.fixture(scope="session")
def collected_static(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's static files, collected by its own build step (against the suite's virtualenv)."""
    static_root = tmp_path_factory.mktemp("static")
    env = {**os.environ, "PORTAL_VENV": sys.prefix, "STATIC_ROOT": str(static_root)}
    subprocess.run([str(BUILD_STEPS), "static"], env=env, check=True, timeout=300)
    return static_root
