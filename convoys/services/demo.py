"""Demo data that keeps moving: the first load (rigs, one parked; epics shaped as a chain, a
diamond, a wide wave, a gated task and a mix, launched; one staged on the parked rig), a top-up
that stages and launches a fresh small epic whenever fewer than `keep_open` convoys are open
(`manage.py demo` and the demo swarm call it), and a reset. Writes go through the services."""

import random
from collections.abc import Callable

from django.db import transaction

from convoys.models import (
    CONVOY_OPEN,
    Bead,
    BeadFacts,
    Convoy,
    ConvoyFacts,
    Dispatch,
    Event,
    HandledEvent,
    LogLine,
    Merge,
    Notification,
    Rig,
    Route,
    Worker,
)
from convoys.services import beads, launch, rigs, staging

ACTOR = "demo"
KEEP_OPEN = 4  # open convoys the top-up keeps, the gated one included
ROUTES = (
    ("gt-", "gastown/mayor/rig"),
    ("bd-", "beads"),
    ("fe-", "frontend"),
    ("ops-", "ops"),
    ("hq-", "."),
)
PARKED_RIG, PARKED_PREFIX = "frontend", "fe-"
MOVING_PREFIXES = ("gt-", "bd-", "ops-")
WORDS = (
    "parser",
    "cache",
    "router",
    "schema",
    "worker",
    "billing",
    "search",
    "auth",
    "queue",
    "export",
    "metrics",
    "storage",
    "sync",
    "backup",
    "alerts",
    "layout",
)
# (shape, title, smallest and largest number of tasks) for the epics the top-up stages
TEMPLATES = (
    ("chain", "Chain: {word} release", 3, 5),
    ("diamond", "Diamond: {word} migration", 4, 4),
    ("wide", "Wide wave: {word} test matrix", 3, 6),
    ("mixed", "Mixed: {word} rewrite", 4, 7),
)


def present() -> bool:
    return Convoy.objects.exists()


def load(rng: random.Random | None = None) -> list[str]:
    """The first demo data set. Returns lines describing what it did."""
    rng = rng or random.Random(7)
    for prefix, path in ROUTES:
        rigs.upsert_route(prefix, path)
    builder = Builder(rng)
    lines: list[str] = []
    for prefix, title, shape, size in (
        ("gt-", "Chain: release pipeline", "chain", 6),
        ("bd-", "Diamond: storage migration", "diamond", 4),
        ("gt-", "Wide wave: test matrix", "wide", 8),
        ("ops-", "Gated: production rollout", "gated", 3),
        ("bd-", "Mixed: search rewrite", "mixed", 10),
    ):
        result = launch.launch([builder.epic(prefix, title, shape, size)], force=True, actor=ACTOR)
        lines.append(f"launched {result.convoy_id}: {title}")
    parked = builder.epic(PARKED_PREFIX, "Staged: frontend polish (parked rig)", "chain", 3)
    rigs.set_rig_state(PARKED_RIG, "parked", actor=ACTOR)
    plan = staging.stage([parked], actor=ACTOR)
    lines.append(f"staged {plan.convoy_id} ({plan.status}) on the parked rig '{PARKED_RIG}'")
    return lines


def replenish(
    keep_open: int = KEEP_OPEN, rng: random.Random | None = None
) -> list[tuple[str, str]]:
    """Stage and launch fresh small epics until `keep_open` convoys are open. Returns the
    (convoy id, title) of each one launched."""
    rng = rng or random.Random()
    builder = Builder(rng)
    launched: list[tuple[str, str]] = []
    for _ in range(keep_open - Convoy.objects.filter(status=CONVOY_OPEN).count()):
        shape, pattern, smallest, largest = rng.choice(TEMPLATES)
        title = pattern.format(word=rng.choice(WORDS))
        epic = builder.epic(
            rng.choice(MOVING_PREFIXES), title, shape, rng.randint(smallest, largest)
        )
        result = launch.launch([epic], force=True, actor=ACTOR)
        launched.append((result.convoy_id, title))
    return launched


@transaction.atomic
def reset() -> None:
    """Delete the work data (beads, convoys, dispatches, workers, notifications, the event log,
    merges, workers' log lines, rigs and routes, and the read model derived from them). Accounts, subscriptions to every convoy, tokens and the event counter
    stay: sequence numbers keep counting forward, so open pages and feeders carry on."""
    derived = (BeadFacts, ConvoyFacts)
    work = (Event, HandledEvent, Notification, Dispatch, Worker, Merge, LogLine, Convoy, Bead)
    for model in (*work, *derived):
        model.objects.all().delete()
    Route.objects.all().delete()
    Rig.objects.all().delete()


class Builder:
    """Epics with child tasks wired in one of the demo shapes."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def epic(self, prefix: str, title: str, shape: str, size: int) -> str:
        epic = self.bead(prefix, title, type="epic", priority=1)
        wire: Callable[[str, str, int], None] = getattr(self, shape)
        wire(prefix, epic, size)
        return epic

    def bead(self, prefix: str, title: str, type: str = "task", priority: int | None = None) -> str:
        priority = self.rng.randint(1, 3) if priority is None else priority
        created = beads.create_bead(
            title, prefix=prefix, issue_type=type, priority=priority, actor=ACTOR
        )
        return created.id

    def task(self, prefix: str, epic: str, label: str) -> str:
        kind = self.rng.choice(("task", "task", "bug", "feature", "chore"))
        bead_id = self.bead(prefix, f"{label.capitalize()} {self.rng.choice(WORDS)}", type=kind)
        beads.add_dependency(bead_id, epic, "parent-child", actor=ACTOR)
        return bead_id

    def blocks(self, blocker: str, blocked: str) -> None:
        beads.add_dependency(blocked, blocker, "blocks", actor=ACTOR)

    def chain(self, prefix: str, epic: str, size: int) -> None:
        ids = [self.task(prefix, epic, f"step {i + 1}:") for i in range(size)]
        for blocker, blocked in zip(ids, ids[1:], strict=False):
            self.blocks(blocker, blocked)

    def diamond(self, prefix: str, epic: str, size: int) -> None:
        top, left, right, bottom = (
            self.task(prefix, epic, name) for name in ("design", "build", "migrate", "verify")
        )
        for blocker, blocked in ((top, left), (top, right), (left, bottom), (right, bottom)):
            self.blocks(blocker, blocked)

    def wide(self, prefix: str, epic: str, size: int) -> None:
        setup = self.task(prefix, epic, "set up")
        for i in range(size):
            self.blocks(setup, self.task(prefix, epic, f"suite {i + 1}:"))

    def gated(self, prefix: str, epic: str, size: int) -> None:
        """A go/no-go decision (never dispatched: a person decides) gates the roll-out."""
        decision = self.bead(prefix, "Decide: go / no-go", type="decision")
        beads.add_dependency(decision, epic, "parent-child", actor=ACTOR)
        prep = self.task(prefix, epic, "prepare")
        roll = self.task(prefix, epic, "roll out")
        self.blocks(prep, roll)
        self.blocks(decision, roll)

    def mixed(self, prefix: str, epic: str, size: int) -> None:
        ids = [self.task(prefix, epic, f"part {i + 1}:") for i in range(size)]
        for index, bead_id in enumerate(ids[2:], start=2):
            for blocker in self.rng.sample(ids[:index], k=min(2, index)):
                self.blocks(blocker, bead_id)
