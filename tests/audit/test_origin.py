from __future__ import annotations

from typing import Any

from django.test import RequestFactory

from apps.audit.actions import Origin


def test_it_records_the_client_a_trusted_proxy_forwards(settings: Any) -> None:
    settings.PORTAL_TRUSTED_PROXIES = ["127.0.0.1"]
    request = RequestFactory().get("/", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.7")
    assert Origin.from_request(request).ip_address == "203.0.113.7"


def test_it_ignores_a_forwarded_header_from_anyone_else(settings: Any) -> None:
    settings.PORTAL_TRUSTED_PROXIES = ["127.0.0.1"]
    request = RequestFactory().get("/", REMOTE_ADDR="198.51.100.4", HTTP_X_FORWARDED_FOR="203.0.113.7")
    assert Origin.from_request(request).ip_address == "198.51.100.4"
