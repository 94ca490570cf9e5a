"""Read a few columns of many rows straight into numpy arrays.

On PostgreSQL each column comes back as one string of big-endian binary values
(`string_agg(int8send(...))`), read with `np.frombuffer`: no Python object per
row, which is what makes the ledger of a million-event job fast. The
aggregates of one query see the rows in the same order, so the columns line
up. Other databases (SQLite) fetch rows.
"""

import numpy as np
from django.db import connection

INT = "int"
FLOAT = "float"
_PG = {INT: ("int8", "int8send", ">i8"), FLOAT: ("float8", "float8send", ">f8")}
_NUMPY = {INT: np.int64, FLOAT: np.float64}


def load_columns(table: str, columns: list[tuple[str, str]], where: str, params: list):
    """One array per (SQL expression, INT or FLOAT) of `table`'s rows matching `where`."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            aggs = ", ".join(
                f"string_agg({_PG[kind][1]}(({expr})::{_PG[kind][0]}), '')"
                for expr, kind in columns
            )
            cursor.execute(f"SELECT {aggs} FROM {table} WHERE {where}", params)
            packed = cursor.fetchone()
            return [
                np.frombuffer(b or b"", dtype=_PG[kind][2]).astype(_NUMPY[kind])
                for b, (_, kind) in zip(packed, columns, strict=True)
            ]
        exprs = ", ".join(expr for expr, _ in columns)
        cursor.execute(f"SELECT {exprs} FROM {table} WHERE {where}", params)
        rows = cursor.fetchall()
    values = list(zip(*rows, strict=True)) if rows else [()] * len(columns)
    return [np.asarray(v, dtype=_NUMPY[kind]) for v, (_, kind) in zip(values, columns, strict=True)]
