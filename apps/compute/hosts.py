"""Where a notebook is served: a host name of its own under ``PORTAL_NOTEBOOK_DOMAIN``.

Notebook ``lab`` with id 42 is served at ``<scheme>://lab-42.<domain>[:<port>]/``, the scheme and
port those of ``PORTAL_PUBLIC_URL``: its own origin, which the portal's cookies never reach
(JupyterHub's ``subdomain_host``). Names are DNS labels that may themselves end in ``-<digits>``
or contain ``--``, so the label is the name cut to fit 63 characters, then ``-<id>``: the id alone
decides which notebook a label means, and the name must match for the label to be valid.

The same redirect answers every request to a notebook host that has no session there, whether a
notebook runs behind it or not (``unauthenticated_redirect``): the notebook's server sends it,
and so does the portal for a host with nothing behind it (``apps.compute.middleware``).
"""

from __future__ import annotations

import re
import urllib.parse

from django.conf import settings

MAX_LABEL = 63  # RFC 1035: a DNS label is at most 63 characters
CALLBACK_PATH = "/portal-auth/callback"
_DIGITS = re.compile(r"^[1-9][0-9]*$")


def host_label(name: str, pk: int) -> str:
    """The notebook's DNS label: ``<name, cut to fit>-<pk>``."""
    suffix = f"-{pk}"
    head = name[: MAX_LABEL - len(suffix)].rstrip("-")
    label = f"{head}{suffix}" if head else f"nb{suffix}"
    if label[2:4] == "--":  # 'xn--' and the like are reserved for international names
        label = f"nb{suffix}"
    return label


def pk_of_label(label: str) -> int | None:
    """The notebook id a label names, or None for a label no notebook could have."""
    head, _, tail = label.rpartition("-")
    if not head or not _DIGITS.match(tail) or len(label) > MAX_LABEL:
        return None
    return int(tail)


def _public() -> urllib.parse.SplitResult:
    return urllib.parse.urlsplit(settings.PORTAL_PUBLIC_URL)


def notebook_host(label: str) -> str:
    return f"{label}.{settings.PORTAL_NOTEBOOK_DOMAIN}"


def notebook_origin(label: str) -> str:
    """``scheme://<label>.<domain>[:port]``, with the portal's public scheme and port."""
    public = _public()
    port = f":{public.port}" if public.port else ""
    return f"{public.scheme}://{notebook_host(label)}{port}"


def split_host(header: str) -> str:
    """The host name of a Host header, lowercased, without its port or a trailing dot."""
    host = header.strip().lower()
    if host.startswith("["):  # an IPv6 literal: never a notebook's
        return host.partition("]")[0] + "]"
    return host.rpartition(":")[0].rstrip(".") if ":" in host else host.rstrip(".")


def label_of_host(host: str) -> str | None:
    """The part of ``host`` before the notebook domain, if ``host`` lies strictly under it."""
    suffix = "." + settings.PORTAL_NOTEBOOK_DOMAIN
    if host.endswith(suffix) and len(host) > len(suffix):
        return host[: -len(suffix)]
    return None


def authorize_url(label: str) -> str:
    """The portal's page that signs a browser in to the notebook of ``label``."""
    return f"{settings.PORTAL_PUBLIC_URL}/notebooks/authorize/{urllib.parse.quote(label, safe='')}/"


def safe_next(value: str) -> str:
    """``value`` if it is a path on the notebook's own host, else ``/``: never an open redirect."""
    if (
        not value.startswith("/")
        or value.startswith("//")
        or "\\" in value
        or any(ord(c) < 0x21 or ord(c) == 0x7F for c in value)
    ):
        return "/"
    return value


def unauthenticated_redirect(authorize: str, path: str, query: str) -> str:
    """Where a request without a session on a notebook host goes: the portal's authorize page,
    with the request's path (and query) to come back to. The notebook's server
    (workers/notebook/portal_identity.py) builds the same URL the same way."""
    target = path + ("?" + query if query else "")
    return authorize + "?" + urllib.parse.urlencode({"next": target})


def callback_url(label: str, code: str, next_path: str) -> str:
    query = urllib.parse.urlencode({"code": code, "next": safe_next(next_path)})
    return f"{notebook_origin(label)}{CALLBACK_PATH}?{query}"
