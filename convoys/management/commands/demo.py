"""`manage.py demo [--reset]`: demo data so there is something to see — rigs (one parked),
epics shaped as a chain, a diamond, a wide wave and a gated task, staged and launched
convoys, and the demo account (never in production: CONVOY_PRODUCTION=1 refuses)."""

import os
import random

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from ...models import Bead, Convoy
from ...services import beads, launch, notify, rigs, staging
from ...services.errors import ServiceError
from ..base import ServiceCommand, error

DEMO_USER, DEMO_PASSWORD = "demo", "convoy-demo"
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


class Command(ServiceCommand):
    help = "Load demo data and the demo account (development only)."

    def add_arguments(self, parser):
        parser.add_argument("--reset", action="store_true", help="delete beads and convoys first")
        parser.add_argument("--seed", type=int, default=7)

    def handle(self, *args, reset, seed, **options):
        if os.environ.get("CONVOY_PRODUCTION", "").lower() in ("1", "true", "yes"):
            raise error("refusing to create demo data with CONVOY_PRODUCTION set")
        self.user()
        if reset:
            Bead.objects.all().delete()
            Convoy.objects.all().delete()
        elif Convoy.objects.exists():
            self.stdout.write("Demo data already present (use --reset to rebuild).")
            return
        rng = random.Random(seed)
        for prefix, path in (
            ("gt-", "gastown/mayor/rig"),
            ("bd-", "beads"),
            ("fe-", "frontend"),
            ("ops-", "ops"),
            ("hq-", "."),
        ):
            rigs.upsert_route(prefix, path)
        shapes = [
            ("gt-", "Chain: release pipeline", self.chain, 6),
            ("bd-", "Diamond: storage migration", self.diamond, 0),
            ("gt-", "Wide wave: test matrix", self.wide, 8),
            ("ops-", "Gated: production rollout", self.gated, 0),
            ("bd-", "Mixed: search rewrite", self.mixed, 10),
        ]
        for prefix, title, build, size in shapes:
            epic = self.bead(prefix, title, rng, type="epic", priority=1)
            build(prefix, epic, rng, size)
            try:
                result = launch.launch([epic], force=True, actor="demo")
                self.stdout.write(f"launched {result.convoy_id}: {title}")
            except ServiceError as exc:
                self.stdout.write(f"could not launch {title}: {exc}")
        parked = self.bead("fe-", "Staged: frontend polish (parked rig)", rng, type="epic")
        self.chain("fe-", parked, rng, 3)
        rigs.set_rig_state("frontend", "parked", actor="demo")
        plan = staging.stage([parked], actor="demo")
        self.stdout.write(f"staged {plan.convoy_id} ({plan.status}) on the parked rig 'frontend'")
        self.stdout.write(f"Demo account: {DEMO_USER} / {DEMO_PASSWORD}")

    def user(self):
        User = get_user_model()
        user, created = User.objects.get_or_create(
            username=DEMO_USER, defaults={"is_staff": True, "email": "demo@localhost"}
        )
        if created:
            user.set_password(DEMO_PASSWORD)
            user.save()
        user.user_permissions.add(*Permission.objects.filter(content_type__app_label="convoys"))
        notify.subscribe(user, None, email=False)
        return user

    def bead(self, prefix, title, rng, type="task", priority=None):
        bead = beads.create_bead(
            title,
            prefix=prefix,
            issue_type=type,
            priority=rng.randint(1, 3) if priority is None else priority,
            actor="demo",
        )
        return bead.id

    def task(self, prefix, epic, rng, label):
        bead_id = self.bead(
            prefix,
            f"{label.capitalize()} {rng.choice(WORDS)}",
            rng,
            type=rng.choice(("task", "task", "bug", "feature", "chore")),
        )
        beads.add_dependency(bead_id, epic, "parent-child", actor="demo")
        return bead_id

    def chain(self, prefix, epic, rng, size):
        ids = [self.task(prefix, epic, rng, f"step {i + 1}:") for i in range(size)]
        for a, b in zip(ids, ids[1:], strict=False):
            beads.add_dependency(b, a, "blocks", actor="demo")

    def diamond(self, prefix, epic, rng, size):
        top, left, right, bottom = (
            self.task(prefix, epic, rng, n) for n in ("design", "build", "migrate", "verify")
        )
        for blocker, blocked in ((top, left), (top, right), (left, bottom), (right, bottom)):
            beads.add_dependency(blocked, blocker, "blocks", actor="demo")

    def wide(self, prefix, epic, rng, size):
        setup = self.task(prefix, epic, rng, "set up")
        for i in range(size):
            beads.add_dependency(
                self.task(prefix, epic, rng, f"suite {i + 1}:"), setup, "blocks", actor="demo"
            )

    def gated(self, prefix, epic, rng, size):
        decision = self.bead(prefix, "Decide: go / no-go", rng, type="decision")
        beads.add_dependency(decision, epic, "parent-child", actor="demo")
        prep = self.task(prefix, epic, rng, "prepare")
        roll = self.task(prefix, epic, rng, "roll out")
        beads.add_dependency(roll, prep, "blocks", actor="demo")
        beads.add_dependency(roll, decision, "blocks", actor="demo")

    def mixed(self, prefix, epic, rng, size):
        ids = [self.task(prefix, epic, rng, f"part {i + 1}:") for i in range(size)]
        for index, bead_id in enumerate(ids[2:], start=2):
            for blocker in rng.sample(ids[:index], k=min(2, index)):
                beads.add_dependency(bead_id, blocker, "blocks", actor="demo")
