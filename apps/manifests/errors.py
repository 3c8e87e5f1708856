"""A document the manifest engine refuses, by the document's own field names."""

from __future__ import annotations


class Invalid(Exception):
    """A document the serializers or actions refuse: messages by the document's field (``spec.gpus``,
    ``metadata.name``), so that the error points at the line to fix."""

    def __init__(self, fields: dict[str, list[str]]):
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in fields.items()))
        self.fields = fields
