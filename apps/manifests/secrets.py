"""Credentials never travel in a manifest: a cluster's connection names the file that holds one
(``kubeconfig: /etc/gpuportal/clusters/a.kubeconfig``), read on the portal's hosts, and is refused
where it carries the credential itself; an export leaves out any connection setting that looks like
one (a cluster registered through the API with a credential in it)."""

from __future__ import annotations

import re
from typing import Any

from apps.manifests.errors import Invalid

# Setting names that say a credential is in them: a token, a password, a key, a certificate's data.
SECRET_NAME = re.compile(r"(token|passw|secret|private|credential|api_?key|client_?key|key_?data|cert\w*_?data|auth)",
                         re.IGNORECASE)  # fmt: skip
# Names that hold where a credential is, not the credential: a file's path, a Kubernetes Secret's name.
REFERENCE_NAME = re.compile(r"(_file|_path|_dir|kubeconfig|_tls_secret|_secret_name)$", re.IGNORECASE)
# Values that are a credential whatever their setting is called: a PEM block, a kubeconfig's own
# credentials, a JSON web token, a bearer header.
SECRET_VALUE = re.compile(
    r"-----BEGIN [A-Z ]+-----|client-key-data|client-certificate-data|\btoken:\s|"
    r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}|^\s*(Bearer|Basic)\s",
)
ADVICE = (
    "A credential is never written in a manifest: name the file that holds it on the portal's hosts "
    "(such as kubeconfig: /etc/gpuportal/clusters/NAME.kubeconfig), readable by the portal alone."
)


def _looks_secret(key: str, value: Any) -> bool:
    if isinstance(value, str) and SECRET_VALUE.search(value):
        return True
    return bool(SECRET_NAME.search(key)) and not REFERENCE_NAME.search(key) and value not in (None, "", False)


def _items(connection: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(path, key, value) of every setting, one level of objects deep (``gpu_type_resources.h100``)."""
    out = []
    for key, value in connection.items():
        if isinstance(value, dict):
            out += [(f"{key}.{inner}", str(inner), item) for inner, item in value.items()]
        else:
            out.append((str(key), str(key), value))
    return out


def check_no_inline_secrets(connection: Any) -> None:
    """``Invalid`` naming every connection setting that carries a credential itself."""
    if not isinstance(connection, dict):
        return
    found = {
        f"spec.connection.{path}": [ADVICE] for path, key, value in _items(connection) if _looks_secret(key, value)
    }
    if found:
        raise Invalid(found)


def without_secrets(connection: dict[str, Any]) -> dict[str, Any]:
    """The connection settings an export may show: those that carry no credential."""
    out: dict[str, Any] = {}
    for key, value in connection.items():
        if isinstance(value, dict):
            out[key] = {k: v for k, v in value.items() if not _looks_secret(str(k), v)}
        elif not _looks_secret(str(key), value):
            out[key] = value
    return out
