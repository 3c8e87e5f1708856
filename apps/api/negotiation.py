"""Content negotiation for routes that answer in a format of their own."""

from __future__ import annotations

from typing import Any

from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.request import Request


class AnswerAsIs(BaseContentNegotiation):
    """For a route that answers in a format of its own (a kubeconfig's YAML) whatever the client
    accepts: its errors are the API's JSON, as everywhere."""

    def select_parser(self, request: Request, parsers: list[Any]) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(self, request: Request, renderers: list[Any], format_suffix: str | None = None) -> Any:
        return renderers[0], renderers[0].media_type
