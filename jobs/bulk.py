"""Insert many rows in one round trip, skipping rows that hit a unique key.

PostgreSQL gets one `INSERT ... SELECT FROM unnest(arrays)` statement per
table: the whole batch travels as a few typed arrays. Other databases
(SQLite, the laptop default) get an executemany of the same INSERT.
"""

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
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            arrays = ", ".join(f"%s::{_pg_type(f)}[]" for f in fields)
            cursor.execute(
                f"INSERT INTO {table} ({cols}) SELECT * FROM unnest({arrays}) ON CONFLICT DO NOTHING",
                values,
            )
        else:
            marks = ", ".join(["%s"] * len(fields))
            cursor.executemany(
                f"INSERT INTO {table} ({cols}) VALUES ({marks}) ON CONFLICT DO NOTHING",
                list(zip(*values, strict=True)),
            )
