"""Insert or look up many rows in one round trip.

PostgreSQL gets one statement per table over `unnest(arrays)`: the whole batch
travels as a few typed arrays, bound server-side in binary. (Django's cursors
bind client-side, rendering each array as SQL text with a regex pass over
every element: several times the cost of the insert itself.) Other databases
(SQLite, the laptop default) get an executemany of the same INSERT, and plain
queries for the look-ups.
"""

from collections import defaultdict

import psycopg
from django.db import connection

_PG_ARRAY_TYPES = {
    "bigint": "bigint",
    "integer": "integer",
    "smallint": "smallint",
    "double precision": "double precision",
    "boolean": "boolean",
    "jsonb": "jsonb",
    "timestamp with time zone": "timestamptz",
}


def _pg_type(field) -> str:
    db_type = field.db_type(connection) or field.rel_db_type(connection)
    db_type = db_type.split("(")[0].strip()
    if db_type in ("bigserial", "serial"):
        db_type = "bigint" if db_type == "bigserial" else "integer"
    return _PG_ARRAY_TYPES.get(db_type, "text")


def _binary_cursor():
    """A Django cursor (logged like any other) over a server-side binding psycopg cursor."""
    connection.ensure_connection()
    raw = psycopg.Cursor(connection.connection)
    if connection.queries_logged:
        return connection.make_debug_cursor(raw)
    return connection.make_cursor(raw)


def _unnest(fields) -> str:
    # %b: each array goes in binary, with no text rendering or parsing on either side.
    return "unnest(" + ", ".join(f"%b::{_pg_type(f)}[]" for f in fields) + ")"


def insert_ignoring_conflicts(model, columns: list[str], values: list[list]) -> None:
    """Insert rows given column-wise: values[i] is the list of column i's values.

    Rows whose unique keys already exist are skipped (ON CONFLICT DO NOTHING).
    JSON columns take already-serialised strings.
    """
    if not values or not values[0]:
        return
    meta = model._meta
    fields = [meta.get_field(c) for c in columns]
    table = connection.ops.quote_name(meta.db_table)
    cols = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    if connection.vendor == "postgresql":
        with _binary_cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} ({cols}) SELECT * FROM {_unnest(fields)}"
                " ON CONFLICT DO NOTHING",
                values,
            )
        return
    marks = ", ".join(["%s"] * len(fields))
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {table} ({cols}) VALUES ({marks}) ON CONFLICT DO NOTHING",
            list(zip(*values, strict=True)),
        )


def existing_pairs(model, columns: tuple[str, str], pairs: list[tuple]) -> set[tuple]:
    """Which of the (a, b) values of the two `columns` are stored already."""
    if not pairs:
        return set()
    meta = model._meta
    fields = [meta.get_field(c) for c in columns]
    if connection.vendor == "postgresql":
        table = connection.ops.quote_name(meta.db_table)
        cols = ", ".join(connection.ops.quote_name(f.column) for f in fields)
        with _binary_cursor() as cursor:
            cursor.execute(
                f"SELECT {cols} FROM {table} WHERE ({cols}) IN (SELECT * FROM {_unnest(fields)})",
                [[p[0] for p in pairs], [p[1] for p in pairs]],
            )
            return set(cursor.fetchall())
    a, b = (f.attname for f in fields)
    by_a: dict = defaultdict(set)
    for x, y in pairs:
        by_a[x].add(y)
    found = set()
    for x, ys in by_a.items():
        found.update((x, y) for y in model.objects.filter(**{a: x, f"{b}__in": ys}).values_list(b, flat=True))
    return found
