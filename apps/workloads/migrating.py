"""What the migrations that made the one workload table share (jobs 0008, compute 0012,
inventory 0005, telemetry 0002, audit 0003): set-based SQL that works alike on SQLite and
PostgreSQL, so that a database of any size moves in a few statements.

A job keeps its id (its workload's id is the job's). Instances and notebooks shared id numbers
with jobs, so each gets a new one, above every id in use: its workload records the kind and id it
had (``legacy_kind``, ``legacy_id``), and what referred to it is repointed through them.
"""

from __future__ import annotations

from typing import Any

#: The workload's columns, in the order `copy_workloads` fills them.
WORKLOAD_COLUMNS = (
    "id",
    "kind",
    "workspace_id",
    "name",
    "state",
    "cluster_id",
    "requested_cluster_id",
    "created_by_id",
    "priority",
    "preemptible",
    "wait_reason",
    "workspace_queue_position",
    "cluster_queue_position",
    "estimated_start_at",
    "eligible_at",
    "created_at",
    "admitted_at",
    "started_at",
    "finished_at",
    "backend_state",
    "start_claim",
    "restarts",
    "backend_stopped",
    "legacy_kind",
    "legacy_id",
)

#: A scheduled kind's source columns (jobs, instances): all but the kind's own values.
SCHEDULED = {
    "workspace_id": "workspace_id",
    "name": "name",
    "state": "state",
    "cluster_id": "cluster_id",
    "requested_cluster_id": "requested_cluster_id",
    "created_by_id": "created_by_id",
    "priority": "priority",
    "wait_reason": "wait_reason",
    "workspace_queue_position": "workspace_queue_position",
    "cluster_queue_position": "cluster_queue_position",
    "estimated_start_at": "estimated_start_at",
    "eligible_at": "eligible_at",
    "created_at": "created_at",
    "admitted_at": "admitted_at",
    "started_at": "started_at",
    "finished_at": "finished_at",
    "backend_state": "backend_state",
    "start_claim": "start_claim",
    "restarts": "restarts",
    "backend_stopped": "backend_stopped",
}


def id_offset(schema_editor: Any, *tables: str) -> int:
    """A number that, added to any id of `tables`, gives an id above every workload's."""
    highest = 0
    with schema_editor.connection.cursor() as cursor:
        for table in ("workloads_workload", *tables):
            cursor.execute(f"SELECT MAX(id) FROM {table}")  # noqa: S608 (table names are constants)
            highest = max(highest, cursor.fetchone()[0] or 0)
    return highest


def copy_workloads(
    schema_editor: Any, *, source: str, kind: str, offset: int, columns: dict[str, str], constants: dict[str, Any]
) -> None:
    """One workload per row of `source`: id + `offset`, `columns` copied (workload column ->
    source column), `constants` set (workload column -> value), the rest empty."""
    names, expressions, params = (
        ["id", "kind", "legacy_kind", "legacy_id"],
        ["id + %s", "%s", "%s", "id"],
        [
            offset,
            kind,
            kind,
        ],
    )
    for column in WORKLOAD_COLUMNS:
        if column in names:
            continue
        if column in columns:
            names.append(column)
            expressions.append(columns[column])
        elif column in constants:
            names.append(column)
            expressions.append("%s")
            params.append(constants[column])
    _execute(
        schema_editor,
        f"INSERT INTO workloads_workload ({', '.join(names)}) SELECT {', '.join(expressions)} FROM {source}",  # noqa: S608
        params,
    )


def copy_details(schema_editor: Any, *, source: str, target: str, offset: int, columns: list[str]) -> None:
    """The kind's own columns of each row of `source` into `target`, keyed by its new workload."""
    listed = ", ".join(columns)
    _execute(
        schema_editor,
        f"INSERT INTO {target} (workload_ptr_id, {listed}) SELECT id + %s, {listed} FROM {source}",  # noqa: S608
        [offset],
    )


def copy_single_pod_sets(schema_editor: Any, *, source: str, offset: int) -> None:
    """One pod set ("main") per row of `source`, from its replicas and what one holds."""
    _execute(
        schema_editor,
        "INSERT INTO workloads_podset (workload_id, role, position, replicas, gpu_type, gpus, cpu_cores, memory_gb) "
        f"SELECT id + %s, 'main', 0, replicas, gpu_type, gpus_per_replica, cpu_cores, memory_gb FROM {source}",  # noqa: S608
        [offset],
    )


def repoint(schema_editor: Any, *, table: str, column: str, kind: str, where: str = "") -> None:
    """Set `table`.`column`, which held an id of the old `kind` table, to its workload's id."""
    condition = f" AND {where}" if where else ""
    _execute(
        schema_editor,
        f"UPDATE {table} SET {column} = (SELECT w.id FROM workloads_workload w "  # noqa: S608
        f"WHERE w.legacy_kind = %s AND w.legacy_id = {table}.{column}) WHERE {column} IS NOT NULL{condition}",
        [kind],
    )


def repoint_into(schema_editor: Any, *, table: str, column: str, kind: str) -> None:
    """Set `table`.workload_id from `column`, which held an id of the old `kind` table."""
    _execute(
        schema_editor,
        f"UPDATE {table} SET workload_id = (SELECT w.id FROM workloads_workload w "  # noqa: S608
        f"WHERE w.legacy_kind = %s AND w.legacy_id = {table}.{column}) WHERE {column} IS NOT NULL",
        [kind],
    )


def execute(schema_editor: Any, sql: str, params: list[Any] | None = None) -> None:
    _execute(schema_editor, sql, params or [])


def reset_workload_ids(schema_editor: Any) -> None:
    """PostgreSQL: new workloads are numbered after those inserted with their ids (SQLite's
    AUTOINCREMENT follows on its own)."""
    if schema_editor.connection.vendor != "postgresql":
        return
    _execute(
        schema_editor,
        "SELECT setval(pg_get_serial_sequence('workloads_workload', 'id'), COALESCE(MAX(id), 1), MAX(id) IS NOT NULL) "
        "FROM workloads_workload",
        [],
    )


def _execute(schema_editor: Any, sql: str, params: list[Any]) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(sql, params)


def settle(schema_editor: Any) -> None:
    """PostgreSQL: check now the foreign keys of the rows just written (deferred to the commit
    otherwise), so that the migration may alter those tables next."""
    if schema_editor.connection.vendor == "postgresql":
        _execute(schema_editor, "SET CONSTRAINTS ALL IMMEDIATE", [])
        _execute(schema_editor, "SET CONSTRAINTS ALL DEFERRED", [])
