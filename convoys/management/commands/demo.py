"""`manage.py demo [--reset]`: demo data so there is something to see (convoys/services/demo.py:
rigs, one parked; a chain, a diamond, a wide wave, a gated task and a mix, launched; one staged
on the parked rig), topped up with fresh epics while fewer than --keep-open convoys are open,
and the demo account. Run again on the same database, it only tops up; --reset wipes the work
data and loads it afresh. Never in production: CONVOY_PRODUCTION=1 refuses."""

import os
import random
from argparse import ArgumentParser
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser, Permission
from django.core.management import call_command

from convoys.management.base import ServiceCommand, error
from convoys.services import demo, notify, roles

DEMO_USER, DEMO_PASSWORD = "demo", "convoy-demo"


class Command(ServiceCommand):
    help = "Load demo data and the demo account (development only)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--reset", action="store_true", help="wipe beads, convoys and events, then reload"
        )
        parser.add_argument(
            "--prepare",
            action="store_true",
            help="migrate and collect static files first, in this one process (./run.sh)",
        )
        parser.add_argument("--seed", type=int, default=7)
        parser.add_argument(
            "--keep-open",
            type=int,
            default=demo.KEEP_OPEN,
            help=f"launch fresh epics while fewer convoys are open (default {demo.KEEP_OPEN})",
        )

    def handle(
        self, *args: Any, reset: bool, prepare: bool, seed: int, keep_open: int, **options: Any
    ) -> None:
        if os.environ.get("CONVOY_PRODUCTION", "").lower() in ("1", "true", "yes"):
            raise error("refusing to create demo data with CONVOY_PRODUCTION set")
        if prepare:  # one start-up instead of three: a restart of ./run.sh stays quick
            call_command("migrate", interactive=False, verbosity=0)
            call_command("collectstatic", interactive=False, verbosity=0)
        self.user()
        rng = random.Random(seed)
        if reset:
            demo.reset()
            self.stdout.write("Wiped beads, convoys, dispatches and events.")
        if demo.present():
            self.stdout.write("Demo data already present (--reset wipes and reloads it).")
        else:
            for line in demo.load(rng):
                self.stdout.write(line)
        for convoy_id, title in demo.replenish(keep_open, rng):
            self.stdout.write(f"launched {convoy_id}: {title}")
        self.stdout.write(f"Demo account: {DEMO_USER} / {DEMO_PASSWORD}")

    def user(self) -> AbstractUser:
        User = get_user_model()
        user, created = User.objects.get_or_create(
            username=DEMO_USER, defaults={"is_staff": True, "email": "demo@localhost"}
        )
        if created:
            user.set_password(DEMO_PASSWORD)
            user.save()
        user.user_permissions.add(*Permission.objects.filter(content_type__app_label="convoys"))
        roles.set_role(DEMO_USER, "admin")  # `users list` names its role
        notify.subscribe(user, None, email=False)
        return user
