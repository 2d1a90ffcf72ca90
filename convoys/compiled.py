"""Queries whose SQL is compiled once per shape, then run again with new values.

Django compiles a queryset's SQL every time it runs it. For the rules with nested EXISTS
subqueries (the readiness rule, a bead's last dispatch) that compile costs about thirty times
running the query, and a live update of a convoy page runs them for a few beads each time.
`Shaped` builds the query the usual way (the rule stays where it is written) twice, from two
sets of stand-in ids and two stand-in times, and keeps the SQL when both compile to the same
text: the values that differ between the two are the ids and the times (each at a fixed
offset from the time given: a cutoff); every other value stays as compiled. Whatever does not
fit (different text, a value it cannot place) is run by the ORM as it always was.
"""

import threading
from collections.abc import Callable, Hashable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections, router
from django.db.models import Model, QuerySet

Build = Callable[[Sequence[str], datetime], QuerySet[Any, Any]]
Slot = tuple[str, Any]  # ("id", index) | ("at", offset) | ("value", compiled value)

SHAPES = 64  # id counts kept per query (more ids: the ORM compiles as usual)
_STAND_INS = (
    datetime(2001, 2, 3, 4, 5, 6, 7000, tzinfo=UTC),
    datetime(2002, 3, 4, 5, 6, 7, 8000, tzinfo=UTC),
)


class Shaped:
    """A query of some ids at some time (`build(ids, at)`: a values_list of columns the
    database returns as they are, text or numbers) of `model`'s database, compiled once per
    database, number of ids and `varies()`: the settings the query reads (a timeout), whose
    values the SQL keeps as it keeps every other constant."""

    def __init__(
        self, model: type[Model], build: Build, varies: Callable[[], Hashable] = lambda: None
    ) -> None:
        self.model = model
        self.build = build
        self.varies = varies
        self._shapes: dict[tuple[str, int, Hashable], tuple[str, list[Slot]] | None] = {}
        self._lock = threading.Lock()

    def rows(self, ids: Sequence[str], at: datetime) -> list[tuple[Any, ...]]:
        """The query's rows for `ids` at `at`."""
        ids = list(dict.fromkeys(ids))
        alias = router.db_for_read(self.model)
        key = (alias, len(ids), self.varies())
        with self._lock:
            known = key in self._shapes
            shape = self._shapes.get(key)
        if not known and ids and len(ids) <= SHAPES:
            shape = self._compile(alias, len(ids))
            with self._lock:
                self._shapes[key] = shape
        if shape is None:
            return [r if isinstance(r, tuple) else (r,) for r in self.build(ids, at)]
        sql, slots = shape
        connection = connections[alias]
        params = [_value(slot, ids, at, connection) for slot in slots]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return [tuple(r) for r in cursor.fetchall()]

    def _compile(self, alias: str, count: int) -> tuple[str, list[Slot]] | None:
        connection = connections[alias]
        compiled = []
        for n, at in enumerate(_STAND_INS):
            ids = [f"\x1f{n}:{i}\x1f" for i in range(count)]
            queryset = self.build(ids, at)
            compiler = queryset.query.get_compiler(alias)
            compiled.append((ids, compiler.as_sql()))
            if not queryset.query.values_select or compiler.get_converters(
                [column for column, _, _ in compiler.select]
            ):
                return None  # rows the ORM converts (models, dates, JSON): not here
        (ids_a, (sql_a, params_a)), (ids_b, (sql_b, params_b)) = compiled
        if sql_a != sql_b or len(params_a) != len(params_b):
            return None
        slots: list[Slot] = []
        for a, b in zip(params_a, params_b, strict=True):
            if a == b:
                slots.append(("value", a))
            elif a in ids_a and b in ids_b and ids_a.index(a) == ids_b.index(b):
                slots.append(("id", ids_a.index(a)))
            else:
                offset = _offset(a, _STAND_INS[0], connection)
                if offset is None or offset != _offset(b, _STAND_INS[1], connection):
                    return None
                slots.append(("at", offset))
        return sql_a, slots


def _offset(value: Any, at: datetime, connection: Any) -> timedelta | None:
    """How far the compiled time `value` is from `at`, or None when it is no time."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return None
    else:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    offset = moment - at
    # Only what the database adapter gives back for that time: a value it would write.
    if connection.ops.adapt_datetimefield_value(at + offset) != value:
        return None
    return offset


def _value(slot: Slot, ids: Sequence[str], at: datetime, connection: Any) -> Any:
    kind, detail = slot
    if kind == "id":
        return ids[detail]
    if kind == "at":
        return connection.ops.adapt_datetimefield_value(at + detail)
    return detail
