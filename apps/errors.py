"""The errors actions raise: a refusal meant for the user, with a code a program can test.

This module imports neither DRF nor any backend, so actions, tasks and management commands raise
these errors without depending on the API. The API maps them to its error shape
(apps/api/errors.py); the web pages and the console show their message.

An error's `status_code` is the HTTP status the API answers it with, stated with the standard
library's `HTTPStatus`: a subclass that means "not found" or "unavailable" says so where it is
defined, and the API needs no table to keep in step.
"""

from __future__ import annotations

from http import HTTPStatus

# The field code of a refusal by a rule the schema cannot state: one that spans fields, or reads
# the portal's state (a policy, a quota, what the workspace allows).
RULE = "rule"


class ActionError(Exception):
    """A request the portal refuses, with a message meant for the user; `field` names the input
    at fault, if one is."""

    status_code: int = HTTPStatus.BAD_REQUEST
    code = "invalid"

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field


class LimitExceeded(ActionError):
    """A hard limit of the workspace would be broken (max instances, max notebooks, size)."""

    status_code = HTTPStatus.CONFLICT
    code = "limit_exceeded"


class Conflict(ActionError):
    """The object is not in a state that allows this (cancelling a finished job...)."""

    status_code = HTTPStatus.CONFLICT
    code = "conflict"


class TooMany(ActionError):
    """Too many of these in too short a time (invitations sent, say): try again in `retry_after` s."""

    status_code = HTTPStatus.TOO_MANY_REQUESTS
    code = "throttled"

    def __init__(self, message: str, *, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after
