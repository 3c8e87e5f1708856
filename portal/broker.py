"""The embedded portal's Celery broker: kombu's filesystem transport, with atomic messages.

kombu's filesystem transport writes each message straight into the queue folder, where a
consumer may take and read the file before it is fully written: under a burst of requests the
worker then read half a message and died (``JSONDecodeError``). Here a message is written whole
into a staging folder beside the queue folder (the same filesystem) and renamed into the queue:
a rename is atomic, so a consumer sees a complete message or none. Everything else is kombu's.

The transport is registered under the name ``atomicfs`` (``atomicfs://localhost//``), with the
same transport options as kombu's (``data_folder_in``, ``data_folder_out``, ...).
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

SCHEME = "atomicfs"


class Channel(filesystem.Channel):  # type: ignore[misc]
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        """Put ``payload`` onto ``queue``: written in the staging folder, then renamed into place."""
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        staging = os.path.join(os.path.dirname(os.path.normpath(self.data_folder_out)), "staging")
        os.makedirs(staging, exist_ok=True)
        partial = os.path.join(staging, name)
        try:
            with open(partial, "wb") as message:
                message.write(str_to_bytes(dumps(payload)))
            os.rename(partial, os.path.join(self.data_folder_out, name))
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot add message {name!r} to the queue folder") from exc


class Transport(filesystem.Transport):  # type: ignore[misc]
    Channel = Channel


TRANSPORT_ALIASES[SCHEME] = f"{__name__}:Transport"
