"""Fast multi-row INSERT for bulk loads (import, event batches).

Django's bulk_create prepares every value through the field machinery, which dominates an
import of 100,000 beads; here each field's adapter is looked up once per batch and the rows
go to the driver with executemany. Only plain columns are supported (no auto fields set).
"""

import json
from datetime import UTC

from django.db import connection, models


def _sqlite_datetime(value):
    # What Django's SQLite backend stores: naive UTC, str(datetime) format.
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value.isoformat(sep=" ")


def _json(value):
    if not value:
        return "{}" if isinstance(value, dict) else "[]" if isinstance(value, list) else "null"
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
    plan = []
    for field in fields:
        default = field.get_default() if field.has_default() else None
        plan.append((field.attname, _adapter(field), default))
    params = []
    for row in rows:
        values = []
        for name, adapt, default in plan:
            value = row.get(name, default)
            if callable(value):
                value = value()
            values.append(adapt(value) if adapt is not None and value is not None else value)
        params.append(values)
    with connection.cursor() as cursor:
        for start in range(0, len(params), batch):
            cursor.executemany(sql, params[start : start + batch])
    return len(rows)
