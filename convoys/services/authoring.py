"""Creating work from the web: an epic with its children and their dependencies, in one
transaction, with ids drawn from a route's prefix as `beads create --prefix` draws them.

Children are written one per line; a line may end with `| after 1, 3, gt-abc`: it waits for
those earlier lines (by number) or existing beads. Only earlier lines can be named, so the
children can never form a cycle among themselves.
"""

from dataclasses import dataclass, field
from typing import NamedTuple

from django.db import transaction

from convoys.core.parsing import whole_number
from convoys.models import SLINGABLE_TYPES, Bead, Route
from convoys.services import beads
from convoys.services.errors import ServiceError

MAX_CHILDREN = 200


@dataclass
class Child:
    line: int
    title: str
    after_lines: list[int] = field(default_factory=list)  # 1-based numbers of earlier children
    after_beads: list[str] = field(default_factory=list)  # ids of existing beads


class CreatedEpic(NamedTuple):
    epic: Bead
    children: list[Bead]  # in the order of their lines


def rig_prefixes() -> list[tuple[str, str]]:
    """[(prefix, rig)] of the routes that lead to a rig: where new work can be dispatched."""
    return list(
        Route.objects.filter(rig__isnull=False).order_by("prefix").values_list("prefix", "rig_id")
    )


def check_prefix(prefix: str) -> str:
    if prefix not in dict(rig_prefixes()):
        raise ServiceError(f'prefix "{prefix}" is not routed to a rig')
    return prefix


def parse_children(text: str | None) -> list[Child]:
    """Children from text, one per line; refusals name the line ("line 3: …")."""
    children: list[Child] = []
    for raw in (text or "").splitlines():
        if not raw.strip():
            continue
        number = len(children) + 1
        title, _, after = raw.partition("|")
        title = title.strip()
        if not title:
            raise ServiceError(f"line {number}: a child needs a title before '|'")
        child = Child(number, title)
        after = after.strip()
        if after:
            if not after.lower().startswith("after "):
                raise ServiceError(f"line {number}: write '| after 1, 2' after the title")
            for ref in after[6:].replace(",", " ").split():
                if ref.isdigit():  # any digits name a line: `after ²` is refused as one
                    line = whole_number(ref, most=number - 1)
                    if line is None or line < 1:
                        raise ServiceError(
                            f"line {number}: 'after {ref[:20]}' must name an earlier line "
                            + ("(line 1)" if number == 2 else f"(lines 1 to {number - 1})")
                            if number > 1
                            else f"line {number}: the first child cannot wait for a line"
                        )
                    child.after_lines.append(line)
                else:
                    child.after_beads.append(ref)
        child.after_lines = list(dict.fromkeys(child.after_lines))
        child.after_beads = list(dict.fromkeys(child.after_beads))
        children.append(child)
    if len(children) > MAX_CHILDREN:
        raise ServiceError(f"at most {MAX_CHILDREN} children at once, got {len(children)}")
    named = {ref for c in children for ref in c.after_beads}
    missing = sorted(named - set(Bead.objects.filter(pk__in=named).values_list("pk", flat=True)))
    if missing:
        line = next(c.line for c in children if missing[0] in c.after_beads)
        raise ServiceError(f"line {line}: bead '{missing[0]}' not found")
    return children


@transaction.atomic
def create_epic(
    title: str,
    *,
    prefix: str,
    children_text: str = "",
    description: str = "",
    priority: int = 2,
    child_type: str = "task",
    actor: str = "",
) -> CreatedEpic:
    """The epic, its children (parent-child) and their blocking dependencies; all or nothing."""
    check_prefix(prefix)
    if child_type not in SLINGABLE_TYPES or not child_type:
        raise ServiceError(f'child type "{child_type}" cannot be dispatched')
    children = parse_children(children_text)
    epic = beads.create_bead(
        title,
        prefix=prefix,
        issue_type="epic",
        priority=priority,
        description=description,
        actor=actor,
    )
    created: list[Bead] = []
    for child in children:
        bead = beads.create_bead(
            child.title, prefix=prefix, issue_type=child_type, priority=priority, actor=actor
        )
        beads.add_dependency(bead.id, epic.id, "parent-child", actor=actor)
        for number in child.after_lines:
            beads.add_dependency(bead.id, created[number - 1].id, "blocks", actor=actor)
        for target in child.after_beads:
            beads.add_dependency(bead.id, target, "blocks", actor=actor)
        created.append(bead)
    return CreatedEpic(epic, created)
