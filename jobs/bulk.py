"""Insert, look up and update many rows, one statement per table.

PostgreSQL gets one statement over `unnest(arrays)`: the whole batch travels
as a few typed arrays, bound server-side in binary. (Django's cursors bind
client-side, rendering each array as SQL text with a regex pass over every
element: several times the cost of the insert itself.) Arrays of ints, floats,
strings and aware datetimes are encoded here, numbers through numpy; anything
else is left to psycopg's own (per-element, slower) list dumping. Where the
caller holds the lock that guards a unique key, an insert skips the rows already
stored by looking their keys up rather than by ON CONFLICT (cheaper for new
rows). Other databases (SQLite, the laptop default) get an executemany of the
same statement, and plain queries for the look-ups.
"""

import functools
import struct
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import numpy as np
import psycopg
from django.db import connection
from psycopg.adapt import Dumper
from psycopg.pq import Format

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


class _Array:
    """An array already in PostgreSQL's binary format, and its type's oid."""

    __slots__ = ("data", "oid")

    def __init__(self, data: bytes, oid: int):
        self.data = data
        self.oid = oid


class _ArrayDumper(Dumper):
    format = Format.BINARY

    def get_key(self, obj, format):
        return (_Array, obj.oid)

    def upgrade(self, obj, format):
        dumper = _ArrayDumper(_Array)
        dumper.oid = obj.oid
        return dumper

    def dump(self, obj):
        return obj.data


_ARRAY_HEADER = struct.Struct("!iiiii")  # dimensions, has nulls, element oid, length, lower bound
_pack_len = struct.Struct("!i").pack
_NULL = _pack_len(-1)
# Python type -> element oid, array oid, numpy type, struct format
_NUMBERS = {int: (20, 1016, ">i8", "!iq"), float: (701, 1022, ">f8", "!id")}
_TEXT, _TEXT_ARRAY = 25, 1009
_TIMESTAMPTZ, _TIMESTAMPTZ_ARRAY = 1184, 1185
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)  # timestamptz counts microseconds from it
_MICROSECOND = timedelta(microseconds=1)


def _encode(values: list):
    """`values` as a binary int8[], float8[], text[] or timestamptz[] (aware datetimes; the
    query casts it), when they all share one of those types; otherwise as they are, for
    psycopg to dump."""
    types = set(map(type, values))
    hasnull = type(None) in types
    types.discard(type(None))
    if len(types) != 1:
        return values
    t = types.pop()
    try:
        if t in _NUMBERS:
            oid, array_oid, dtype, fmt = _NUMBERS[t]
            if hasnull:
                pack = struct.Struct(fmt).pack
                body = b"".join([_NULL if v is None else pack(8, v) for v in values])
            else:
                rows = np.empty(len(values), [("len", ">i4"), ("value", dtype)])
                rows["len"] = 8
                rows["value"] = values
                body = rows.tobytes()
        elif t is str:
            oid, array_oid = _TEXT, _TEXT_ARRAY
            encoded = [None if v is None else v.encode() for v in values]
            body = b"".join([_NULL if b is None else _pack_len(len(b)) + b for b in encoded])
        elif t is datetime and all(v is None or v.tzinfo is not None for v in values):
            oid, array_oid = _TIMESTAMPTZ, _TIMESTAMPTZ_ARRAY
            pack = struct.Struct("!iq").pack
            epoch, us = _PG_EPOCH, _MICROSECOND
            body = b"".join([_NULL if v is None else pack(8, (v - epoch) // us) for v in values])
        else:
            return values
    except (OverflowError, struct.error, UnicodeEncodeError):
        return values  # psycopg's way, errors included
    return _Array(_ARRAY_HEADER.pack(1, hasnull, oid, len(values), 1) + body, array_oid)


def _binary_cursor():
    """A Django cursor (logged like any other) over a server-side binding psycopg cursor."""
    connection.ensure_connection()
    raw = psycopg.Cursor(connection.connection)
    raw.adapters.register_dumper(_Array, _ArrayDumper)
    if connection.queries_logged:
        return connection.make_debug_cursor(raw)
    return connection.make_cursor(raw)


def _unnest(fields) -> str:
    return _unnest_sql(tuple(fields))


@functools.cache  # the same few column lists, batch after batch
def _unnest_sql(fields: tuple) -> str:
    # %b: each array goes in binary, with no text rendering or parsing on either side.
    return "unnest(" + ", ".join(f"%b::{_pg_type(f)}[]" for f in fields) + ")"


def _prep_save(field, values: list) -> list:
    """`values` as `field.get_db_prep_save` makes them, one by one; on PostgreSQL, aware
    datetimes go as they are (what it would return for them, at a fraction of the cost)."""
    if connection.vendor == "postgresql" and all(
        type(v) is datetime and v.tzinfo is not None for v in values
    ):
        return values
    return [field.get_db_prep_save(v, connection) for v in values]


def ids_by(model, column: str, values: list, **equal) -> dict:
    """{value: primary key} of the rows whose `column` holds one of `values` and whose
    fields equal `equal` (field=value): one query, in no particular order."""
    if not values:
        return {}
    if connection.vendor != "postgresql":
        found = model.objects.filter(**equal, **{f"{column}__in": values}).order_by()
        return dict(found.values_list(column, "pk"))
    meta = model._meta
    qn = connection.ops.quote_name
    field = meta.get_field(column)
    where = [f"{qn(meta.get_field(k).column)} = %s" for k in equal]
    params = [meta.get_field(k).get_db_prep_value(v, connection) for k, v in equal.items()]
    where.append(f"{qn(field.column)} = ANY(%b::{_pg_type(field)}[])")
    with _binary_cursor() as cursor:
        cursor.execute(
            f"SELECT {qn(field.column)}, {qn(meta.pk.column)} FROM {qn(meta.db_table)}"
            f" WHERE {' AND '.join(where)}",
            [*params, _encode(list(values))],
        )
        return dict(cursor.fetchall())


def _insert_absent_sql(table: str, fields, key_fields, returning: bool) -> str:
    """INSERT of the unnested rows whose key no stored row holds, found by a lookup
    rather than by arbitrating conflicts: right only while no other transaction can
    write those keys (the caller holds the lock that guards them) and the rows do not
    repeat a key among themselves. Cheaper than ON CONFLICT for rows that are new."""
    qn = connection.ops.quote_name
    names = ", ".join(qn(f.column) for f in fields)
    match = " AND ".join(f"t.{qn(f.column)} = v.{qn(f.column)}" for f in key_fields)
    keys = ", ".join(qn(f.column) for f in key_fields)
    return (
        f"INSERT INTO {table} ({names}) SELECT * FROM {_unnest(fields)} AS v({names})"
        f" WHERE NOT EXISTS (SELECT 1 FROM {table} AS t WHERE {match})"
        + (f" RETURNING {keys}" if returning else "")
    )


def insert_ignoring_conflicts(
    model, columns: list[str], values: list[list], *, locked_key: tuple[str, ...] = ()
) -> None:
    """Insert rows given column-wise: values[i] is the list of column i's values.

    Rows whose unique keys already exist are skipped (ON CONFLICT DO NOTHING).
    JSON columns take already-serialised strings. With `locked_key`, the columns of
    the only unique key the rows may meet, whose rows no other transaction can write
    meanwhile (the caller holds their lock) and which the rows do not repeat,
    PostgreSQL skips them by looking the keys up, for less.
    """
    if not values or not values[0]:
        return
    meta = model._meta
    fields = [meta.get_field(c) for c in columns]
    table = connection.ops.quote_name(meta.db_table)
    cols = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    if connection.vendor == "postgresql":
        if locked_key:
            sql = _insert_absent_sql(table, fields, [meta.get_field(c) for c in locked_key], False)
        else:
            sql = (
                f"INSERT INTO {table} ({cols}) SELECT * FROM {_unnest(fields)}"
                " ON CONFLICT DO NOTHING"
            )
        with _binary_cursor() as cursor:
            cursor.execute(sql, [_encode(v) for v in values])
        return
    marks = ", ".join(["%s"] * len(fields))
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {table} ({cols}) VALUES ({marks}) ON CONFLICT DO NOTHING",
            list(zip(*values, strict=True)),
        )


def insert_new(
    model, columns: list[str], values: list[list], key: tuple[str, str], *, locked: bool = False
) -> set[tuple]:
    """Insert the rows whose `key` (two columns) is not stored yet; the keys it inserted.

    Rows are given column-wise, as for `insert_ignoring_conflicts`, and must not
    repeat a key among themselves. PostgreSQL learns what is new from the insert
    itself (ON CONFLICT ... RETURNING; with `locked`, when the caller holds the lock
    that keeps other transactions from writing these keys, from a lookup of the keys
    in the same statement, for less); other databases look the keys up first.
    """
    if not values or not values[0]:
        return set()
    meta = model._meta
    fields = [meta.get_field(c) for c in columns]
    key_fields = [meta.get_field(c) for c in key]
    qn = connection.ops.quote_name
    table = qn(meta.db_table)
    cols = ", ".join(qn(f.column) for f in fields)
    key_cols = ", ".join(qn(f.column) for f in key_fields)
    if connection.vendor == "postgresql":
        if locked:
            sql = _insert_absent_sql(table, fields, key_fields, True)
        else:
            sql = (
                f"INSERT INTO {table} ({cols}) SELECT * FROM {_unnest(fields)}"
                f" ON CONFLICT ({key_cols}) DO NOTHING RETURNING {key_cols}"
            )
        with _binary_cursor() as cursor:
            cursor.execute(sql, [_encode(v) for v in values])
            return set(cursor.fetchall())
    ia, ib = (fields.index(f) for f in key_fields)
    by_a: dict = defaultdict(set)
    for a, b in zip(values[ia], values[ib], strict=True):
        by_a[a].add(b)
    name_a, name_b = (f.attname for f in key_fields)
    stored = set()
    for a, bs in by_a.items():
        found = model.objects.filter(**{name_a: a, f"{name_b}__in": bs})
        stored.update((a, b) for b in found.values_list(name_b, flat=True))
    rows = [r for r in zip(*values, strict=True) if (r[ia], r[ib]) not in stored]
    if rows:
        with connection.cursor() as cursor:
            marks = ", ".join(["%s"] * len(fields))
            cursor.executemany(f"INSERT INTO {table} ({cols}) VALUES ({marks})", rows)
    return {(r[ia], r[ib]) for r in rows}


def update_rows(model, fields: list[str], objs: list) -> None:
    """Save `fields` of model instances `objs` (a few rows) in one statement.

    What `QuerySet.bulk_update` does, without its CASE WHEN per field and row:
    values go through each field's `get_db_prep_save`, as in `Model.save`.
    """
    if not objs:
        return
    meta = model._meta
    pk = meta.pk
    targets = [meta.get_field(f) for f in fields]
    rows = [[pk.get_db_prep_save(o.pk, connection)] for o in objs]
    for row, o in zip(rows, objs, strict=True):
        row.extend(f.get_db_prep_save(getattr(o, f.attname), connection) for f in targets)
    table = connection.ops.quote_name(meta.db_table)
    qn = connection.ops.quote_name
    if connection.vendor == "postgresql":
        names = [qn(pk.column)] + [qn(f.column) for f in targets]
        sets = ", ".join(f"{qn(f.column)} = v.{qn(f.column)}" for f in targets)
        with _binary_cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET {sets} FROM {_unnest([pk, *targets])} AS v({', '.join(names)})"
                f" WHERE {table}.{qn(pk.column)} = v.{qn(pk.column)}",
                [_encode(list(col)) for col in zip(*rows, strict=True)],
            )
        return
    sets = ", ".join(f"{qn(f.column)} = %s" for f in targets)
    with connection.cursor() as cursor:
        cursor.executemany(
            f"UPDATE {table} SET {sets} WHERE {qn(pk.column)} = %s", [r[1:] + r[:1] for r in rows]
        )


def update_to_latest(model, fields: list[str], values: dict, granularity=None) -> None:
    """Move `fields` of the rows {pk: [value per field]} up to their values, never down:
    one statement.

    The comparison happens in the database, so concurrent writers cannot move a
    row back. A NULL field takes the value. With `granularity` (what the values
    subtract, a timedelta for datetimes) a row is rewritten only when one of its
    fields is older than the new value by more than that, and then every field
    moves up: fields updated on every batch stay at most `granularity` behind,
    for one row version per row and granularity.
    """
    if not values:
        return
    meta = model._meta
    pk = meta.pk
    targets = [meta.get_field(f) for f in fields]
    qn = connection.ops.quote_name
    table, key = qn(meta.db_table), qn(pk.column)
    cols = [qn(f.column) for f in targets]
    ids = sorted(values)
    new, below = [], []
    for k, f in enumerate(targets):
        new.append(_prep_save(f, [values[i][k] for i in ids]))
        below.append(
            new[k]
            if granularity is None
            else _prep_save(f, [values[i][k] - granularity for i in ids])
        )
    if connection.vendor == "postgresql":
        names = ["id"] + [f"v{k}" for k in range(len(cols))] + [f"b{k}" for k in range(len(cols))]
        # GREATEST skips NULLs: a NULL field takes the value.
        sets = ", ".join(f"{c} = GREATEST({table}.{c}, v.v{k})" for k, c in enumerate(cols))
        stale = " OR ".join(
            f"{table}.{c} IS NULL OR {table}.{c} < v.b{k}" for k, c in enumerate(cols)
        )
        with _binary_cursor() as cursor:
            # Rows none of whose fields is stale are not touched: no new row version.
            cursor.execute(
                f"UPDATE {table} SET {sets} FROM {_unnest([pk, *targets, *targets])}"
                f" AS v({', '.join(names)}) WHERE {table}.{key} = v.id AND ({stale})",
                [_encode(ids)] + [_encode(v) for v in new] + [_encode(b) for b in below],
            )
        return
    sets = ", ".join(f"{c} = MAX(COALESCE({c}, %s), %s)" for c in cols)
    stale = " OR ".join(f"{c} IS NULL OR {c} < %s" for c in cols)
    rows = []
    for j, i in enumerate(ids):
        row = [v for k in range(len(cols)) for v in (new[k][j], new[k][j])]
        rows.append([*row, i, *(below[k][j] for k in range(len(cols)))])
    with connection.cursor() as cursor:
        cursor.executemany(f"UPDATE {table} SET {sets} WHERE {key} = %s AND ({stale})", rows)


def upsert_spans(model, key: list[str], values: list[list], low: str, high: str) -> None:
    """Insert rows (column-wise, `key` columns then `low` and `high`); where the key
    exists, widen the stored [low, high] to take the new one in. Order-independent."""
    if not values or not values[0]:
        return
    meta = model._meta
    fields = [meta.get_field(c) for c in [*key, low, high]]
    qn = connection.ops.quote_name
    table = qn(meta.db_table)
    cols = ", ".join(qn(f.column) for f in fields)
    keys = ", ".join(qn(meta.get_field(c).column) for c in key)
    lo, hi = qn(meta.get_field(low).column), qn(meta.get_field(high).column)
    if connection.vendor == "postgresql":
        with _binary_cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} ({cols}) SELECT * FROM {_unnest(fields)}"
                f" ON CONFLICT ({keys}) DO UPDATE SET {lo} = LEAST({table}.{lo}, EXCLUDED.{lo}),"
                f" {hi} = GREATEST({table}.{hi}, EXCLUDED.{hi})",
                [_encode(v) for v in values],
            )
        return
    marks = ", ".join(["%s"] * len(fields))
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {table} ({cols}) VALUES ({marks}) ON CONFLICT ({keys}) DO UPDATE"
            f" SET {lo} = MIN({table}.{lo}, excluded.{lo}),"
            f" {hi} = MAX({table}.{hi}, excluded.{hi})",
            list(zip(*values, strict=True)),
        )


def delete_ids(table: str, ids: list[int]) -> None:
    """Delete the rows of `table` with these ids (a table name: a partition too)."""
    if connection.vendor == "postgresql":  # the ids as one binary array a statement
        with _binary_cursor() as cursor:
            for k in range(0, len(ids), 100_000):
                chunk = ids[k : k + 100_000]
                cursor.execute(f"DELETE FROM {table} WHERE id = ANY(%b::int8[])", [_encode(chunk)])
        return
    with connection.cursor() as cursor:
        for k in range(0, len(ids), 500):  # SQLite's limit on parameters is far above
            chunk = ids[k : k + 500]
            cursor.execute(
                f"DELETE FROM {table} WHERE id IN ({', '.join(['%s'] * len(chunk))})", chunk
            )
