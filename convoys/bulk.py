"""Fast multi-row INSERT for bulk loads (import, event batches).

Django's bulk_create prepares every value through the field machinery, which dominates an
import of 100,000 beads; here each row is completed from the defaults and read in column
order in C (dict merge, itemgetter), only datetime and JSON columns are converted in Python,
and the rows go to the driver with executemany. Only plain columns (no auto fields set).
"""

import json
from datetime import UTC
from operator import itemgetter

import orjson
from django.db import connection, models


def _sqlite_datetime(value):
    # What Django's SQLite backend stores: naive UTC, str(datetime) format.
    if value.tzinfo is UTC:
        return value.isoformat(sep=" ")[:-6]  # drop "+00:00"
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.isoformat(sep=" ")


def _json(value):
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # integers beyond 64 bits, which the standard library writes
        return json.dumps(value, ensure_ascii=False)


def _adapter(field):
    if isinstance(field, models.DateTimeField):
        if connection.vendor == "sqlite":
            return _sqlite_datetime
        return connection.ops.adapt_datetimefield_value
    if isinstance(field, models.JSONField):
        return _json
    return None


def insert(model, rows, batch=20000):
    """Insert dicts keyed by attname (e.g. `issue_id`); missing keys take the field default."""
    if not rows:
        return 0
    fields = [
        f
        for f in model._meta.concrete_fields
        if not (f.primary_key and isinstance(f, models.AutoField))
    ]
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    marks = ", ".join(["%s"] * len(fields))
    sql = f"INSERT INTO {connection.ops.quote_name(model._meta.db_table)} ({columns}) VALUES ({marks})"
    defaults = {f.attname: f.get_default() if f.has_default() else None for f in fields}
    read = itemgetter(*defaults)
    convert = [
        (index, adapt)
        for index, adapt in enumerate(_adapter(f) for f in fields)
        if adapt is not None
    ]
    params = []
    for row in rows:
        values = list(read(defaults | row))
        for index, adapt in convert:
            value = values[index]
            if value is not None:
                values[index] = adapt(value)
        params.append(values)
    with connection.cursor() as cursor:
        for start in range(0, len(params), batch):
            cursor.executemany(sql, params[start : start + batch])
    return len(rows)


def existing_keys(model, keys, chunk=900):
    """The subset of primary keys `keys` present in `model`'s table (raw SQL: the ORM's
    `__in` costs microseconds per value, which adds up at 1,000 keys per batch)."""
    table = connection.ops.quote_name(model._meta.db_table)
    column = connection.ops.quote_name(model._meta.pk.column)
    found = []
    with connection.cursor() as cursor:
        for start in range(0, len(keys), chunk):
            part = keys[start : start + chunk]
            marks = ", ".join(["%s"] * len(part))
            cursor.execute(f"SELECT {column} FROM {table} WHERE {column} IN ({marks})", part)
            found.extend(row[0] for row in cursor.fetchall())
    return found
