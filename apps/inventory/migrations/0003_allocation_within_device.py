"""The database refuses to share one GPU above one device: allocations of a GPU never sum above 1.

A check on one row cannot say it; a trigger does, after each insert or update of an allocation.
On PostgreSQL it first locks the GPU's row (FOR NO KEY UPDATE: compatible with the key-share lock
an allocation's foreign key takes, so two inserts do not deadlock), so that concurrent
transactions adding shares to one GPU take turns and each sums what the other committed.
SQLite has one writer at a time.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

POSTGRESQL = [
    """
    CREATE OR REPLACE FUNCTION inventory_allocation_within_device() RETURNS trigger AS $$
    DECLARE
        total numeric;
    BEGIN
        PERFORM 1 FROM inventory_gpu WHERE id = NEW.gpu_id FOR NO KEY UPDATE;
        SELECT COALESCE(SUM(fraction), 0) INTO total FROM inventory_allocation WHERE gpu_id = NEW.gpu_id;
        IF total > 1 THEN
            RAISE EXCEPTION 'GPU % would be shared above one device (% in all)', NEW.gpu_id, total
                USING ERRCODE = 'check_violation';
        END IF;
        RETURN NULL;
    END
    $$ LANGUAGE plpgsql
    """,
    """
    CREATE TRIGGER inventory_allocation_within_device
    AFTER INSERT OR UPDATE OF gpu_id, fraction ON inventory_allocation
    FOR EACH ROW EXECUTE FUNCTION inventory_allocation_within_device()
    """,
]
POSTGRESQL_REVERSE = [
    "DROP TRIGGER IF EXISTS inventory_allocation_within_device ON inventory_allocation",
    "DROP FUNCTION IF EXISTS inventory_allocation_within_device()",
]
SQLITE = [
    f"""
    CREATE TRIGGER inventory_allocation_within_device_{event.split()[0].lower()}
    AFTER {event} ON inventory_allocation
    WHEN (SELECT SUM(fraction) FROM inventory_allocation WHERE gpu_id = NEW.gpu_id) > 1
    BEGIN
        SELECT RAISE(ABORT, 'a GPU would be shared above one device');
    END
    """
    for event in ("INSERT", "UPDATE OF gpu_id, fraction")
]
SQLITE_REVERSE = [
    "DROP TRIGGER IF EXISTS inventory_allocation_within_device_insert",
    "DROP TRIGGER IF EXISTS inventory_allocation_within_device_update",
]


def _run(statements: dict[str, list[str]]) -> Any:
    def run(apps: Any, schema_editor: Any) -> None:
        for statement in statements.get(schema_editor.connection.vendor, []):
            schema_editor.execute(statement, params=None)  # no placeholders: % is plpgsql's own

    return run


class Migration(migrations.Migration):
    dependencies = [("inventory", "0002_initial")]

    operations = [
        migrations.RunPython(
            _run({"postgresql": POSTGRESQL, "sqlite": SQLITE}),
            _run({"postgresql": POSTGRESQL_REVERSE, "sqlite": SQLITE_REVERSE}),
        )
    ]
