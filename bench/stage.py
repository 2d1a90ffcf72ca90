"""Staging cost: the `convoy stage` command against the pure DAG module, side by side.

For epics of 1,000 / 10,000 / 50,000 beads (each task blocked by up to two recent ones) it
prints the median time of the command (database reads, analysis, convoy creation), of the
pure computation (build, cycle check, waves, warnings) on the same data, their ratio, and
the command's query count (constant: it does not grow with the epic).

    .venv/bin/python bench/stage.py [--sizes 1000,10000,50000] [--runs 3]
"""

import argparse
import io
import json
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median, setup, timed  # noqa: E402


def epic_file(path, size, seed=3):
    rng = random.Random(seed)
    with open(path, "w") as out:
        out.write(
            json.dumps(
                {
                    "id": "gt-epic",
                    "title": "Bench epic",
                    "issue_type": "epic",
                    "status": "open",
                    "priority": 1,
                }
            )
            + "\n"
        )
        for i in range(size):
            deps = [{"depends_on_id": "gt-epic", "type": "parent-child"}]
            for back in rng.sample(range(1, 40), k=2):
                if i - back >= 0:
                    deps.append({"depends_on_id": f"gt-t{i - back:06d}", "type": "blocks"})
            out.write(
                json.dumps(
                    {
                        "id": f"gt-t{i:06d}",
                        "title": f"Task {i}",
                        "issue_type": "task",
                        "status": "open",
                        "priority": 2,
                        "dependencies": deps,
                    }
                )
                + "\n"
            )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,10000,50000")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from convoys.core import dag
    from convoys.models import Bead, Convoy
    from convoys.services import jsonl, rigs, staging

    rigs.upsert_route("gt-", "gastown")
    folder = Path(tempfile.mkdtemp(prefix="convoyweb-stage-"))
    print(f"{'beads':>7} {'command':>10} {'pure DAG':>10} {'ratio':>7} {'queries':>8} {'waves':>6}")
    for size in [int(s) for s in args.sizes.split(",")]:
        Convoy.objects.all().delete()
        Bead.objects.all().delete()
        path = folder / f"epic-{size}.jsonl"
        epic_file(path, size)
        jsonl.import_file(path)
        nodes, edges = staging.collect(dag.EPIC, ["gt-epic"])

        def pure(nodes=nodes, edges=edges):
            graph = dag.build_dag(
                [dag.Node(n.id, n.title, n.type, n.status, n.rig) for n in nodes], edges
            )
            dag.detect_errors(graph)
            dag.detect_warnings(graph, dag.EPIC, {})
            return dag.compute_waves(graph)

        def command():
            Convoy.objects.all().delete()
            call_command("convoy", "stage", "gt-epic", "--json", stdout=io.StringIO())

        pure_times = [timed(pure)[0] for _ in range(args.runs)]
        command_times = []
        for _ in range(args.runs):
            with CaptureQueriesContext(connection) as ctx:
                command_times.append(timed(command)[0])
            queries = len(ctx.captured_queries)
        waves = len(pure()[0])
        cmd, pur = median(command_times), median(pure_times)
        print(f"{size:>7} {cmd:>9.2f}s {pur:>9.2f}s {cmd / pur:>6.1f}x {queries:>8} {waves:>6}")
    print("target: 10,000 beads staged by the command in under 2 s")


if __name__ == "__main__":
    main()
