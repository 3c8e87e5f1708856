"""A real SMTP server on loopback (aiosmtpd) that keeps what it receives, for the tests of the mail
the portal sends."""

from __future__ import annotations

import email
import email.policy
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller

from tests.proxy import free_port


@dataclass
class Mailbox:
    port: int
    received: list[EmailMessage] = field(default_factory=list)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 (aiosmtpd's name)
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        message["X-Envelope-To"] = ", ".join(envelope.rcpt_tos)
        self.received.append(message)
        return "250 Message accepted for delivery"

    def wait_for(self, count: int, timeout_s: float = 10) -> list[EmailMessage]:
        deadline = time.monotonic() + timeout_s
        while len(self.received) < count:
            assert time.monotonic() < deadline, f"{len(self.received)} of {count} messages arrived"
            time.sleep(0.05)
        return self.received

    def settings(self) -> dict[str, Any]:
        return {
            "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "EMAIL_HOST": "127.0.0.1",
            "EMAIL_PORT": self.port,
            "EMAIL_USE_TLS": False,
            "EMAIL_USE_SSL": False,
            "EMAIL_HOST_USER": "",
            "EMAIL_HOST_PASSWORD": "",
        }


@contextmanager
def smtp_server() -> Iterator[Mailbox]:
    box = Mailbox(port=free_port())
    controller = Controller(box, hostname="127.0.0.1", port=box.port)
    controller.start()
    try:
        yield box
    finally:
        controller.stop()


def body_of(message: EmailMessage) -> str:
    part = message.get_body(preferencelist=("plain",))
    assert part is not None
    return str(part.get_content())
