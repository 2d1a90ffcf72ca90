"""`manage.py rigs list|park|unpark|dock|undock NAME` and `rigs route PREFIX PATH`."""

from argparse import ArgumentParser
from typing import Any

from convoys.management.base import ServiceCommand
from convoys.models import Bead, Rig, Route
from convoys.services import rigs

STATE_FOR = {"park": Rig.PARKED, "dock": Rig.DOCKED, "unpark": Rig.ACTIVE, "undock": Rig.ACTIVE}


class Command(ServiceCommand):
    help = "List rigs and change their state (parked and docked rigs get no dispatches)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        p = sub.add_parser("list")
        self.add_json(p)
        for action in STATE_FOR:
            sub.add_parser(action).add_argument("name")
        p = sub.add_parser("route", help="map a bead id prefix to a rig path")
        p.add_argument("prefix")
        p.add_argument("path")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        if action == "list":
            rows: list[dict[str, Any]] = []
            for rig in Rig.objects.all():
                prefixes = list(Route.objects.filter(rig=rig).values_list("prefix", flat=True))
                rows.append(
                    {
                        "name": rig.name,
                        "state": rig.state,
                        "prefixes": prefixes,
                        "beads": Bead.objects.filter(rig=rig).count(),
                    }
                )
            if options["json"]:
                self.write_json(rows)
            elif not rows:
                self.stdout.write("No rigs. Import a routes.jsonl or run `rigs route gt- gastown`.")
            for row in rows if not options["json"] else []:
                self.stdout.write(
                    f"{row['name']:<24} {row['state']:<8} {row['beads']:>6} beads  "
                    f"{' '.join(row['prefixes'])}"
                )
        elif action == "route":
            routed = rigs.upsert_route(options["prefix"], options["path"], actor="cli")
            self.stdout.write(f"Route {options['prefix']} -> {routed or '(town level)'}")
        else:
            rig = rigs.set_rig_state(options["name"], STATE_FOR[action], actor="cli")
            self.stdout.write(f"Rig {rig.name} is {rig.state}")
