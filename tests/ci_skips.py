"""In CI no security test may skip: a skipped protection is an unchecked one, so it fails there.

A test is a security test when it lives under ``tests/security/`` or in a module whose name says it
checks isolation (``*isolation*``, ``*security*``, ``*hostile*``, ``*collaborator*``). CI sets
``CI=true``; elsewhere (a workstation without root, say) such a skip stays a skip.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePath

_MODULE_WORDS = ("isolation", "security", "hostile", "collaborator")


def is_security_test(path: str) -> bool:
    """Whether the test module at ``path`` (relative or absolute) checks a security property."""
    parts = PurePath(path).parts
    if "security" in parts[:-1]:
        return True
    return any(word in parts[-1] for word in _MODULE_WORDS) if parts else False


def in_ci(environ: Mapping[str, str]) -> bool:
    return environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def skip_fails(path: str, environ: Mapping[str, str]) -> bool:
    """Whether a skip of the test at ``path`` is turned into a failure."""
    return in_ci(environ) and is_security_test(path)
