"""Every string written is storable on every database and exports to a file that imports
again: no NUL character (PostgreSQL stores none; SQLite would, and the next `beads export`
could not be re-imported) and no lone surrogate (not UTF-8).

Checked for every row of this app before it is saved (`save`, `create`, `update_or_create`:
what services, admin and API writes use), so no service can forget a field; bulk writes (the
import) are checked by convoys/core/beadfile.py as the lines are read.
"""

from typing import Any

from django.db.models import Model
from django.db.models.signals import pre_save

from convoys.core.ids import text_problem
from convoys.services.errors import ServiceError


def _problem(value: object) -> str | None:
    if isinstance(value, str):
        return text_problem(value)
    if isinstance(value, dict):
        value = [*value.keys(), *value.values()]
    if isinstance(value, (list, tuple)):
        for item in value:
            problem = _problem(item)
            if problem:
                return problem
    return None


def refuse_unstorable_text(
    sender: type[Model], instance: Model, raw: bool = False, **_: Any
) -> None:
    if raw or sender._meta.app_label != "convoys":
        return
    for field in sender._meta.concrete_fields:
        problem = _problem(getattr(instance, field.attname))
        if problem:
            raise ServiceError(f"{field.name}: {problem}")


def connect() -> None:
    pre_save.connect(refuse_unstorable_text, dispatch_uid="convoys.refuse_unstorable_text")
