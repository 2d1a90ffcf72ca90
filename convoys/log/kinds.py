"""Every kind of event the log records, and what each one touches.

One registry: recorders refuse a kind that is not here (`events.record_many`), and the
projection, the live pages and the relay ask it what an event may have changed instead of
keeping sets of kinds of their own. Pure: no Django, nothing of the app.

What a kind touches:
  BEAD      the row of the bead it names (status, assignee, fields) and so that bead's facts
  DONE      may move the bead it names into or out of "done": the beads it blocks change too
  FAILED    may change whether the bead counts as failed (its last dispatch failed and it
            is neither running nor done)
  PROGRESS  counts as a convoy's progress (the escalation clock, the pause panel, the ETA)
  FEEDING   whether and how much a convoy feeds (its status, pause, max in flight): the
            causes of beads it does not name
  GRAPH     the dependencies or the beads that exist: a graph's shape
  TRACKING  what a convoy tracks
  CONVOY    a convoy's own row (status, pause, max in flight, fields)
  RIG       a rig's state or the routes: the readiness of every bead of a rig
  CAPACITY  the town's cap (the capacity of every convoy)
  IN_FLIGHT may change what the town counts in flight: a bead's status or worker, a
            dispatch, a silent worker's bead coming back (a merge does not: the bead stays
            closed)
  LISTING   what a page lists (convoys appear, land, close; beads appear)
  TIME      recorded by the ticker when a time passes (a worker's silence, a cooldown's end)
  NOTE      a note in the log that changes no derived fact but its own badge or inbox
"""

from dataclasses import dataclass

BEAD = "bead"
DONE = "done"
FAILED = "failed"
PROGRESS = "progress"
FEEDING = "feeding"
GRAPH = "graph"
TRACKING = "tracking"
CONVOY = "convoy"
RIG = "rig"
CAPACITY = "capacity"
IN_FLIGHT = "in-flight"
LISTING = "listing"
TIME = "time"
NOTE = "note"
TOUCHES = (
    BEAD,
    DONE,
    FAILED,
    PROGRESS,
    FEEDING,
    GRAPH,
    TRACKING,
    CONVOY,
    RIG,
    CAPACITY,
    IN_FLIGHT,
    LISTING,
    TIME,
    NOTE,
)


@dataclass(frozen=True)
class Kind:
    name: str
    touches: frozenset[str]
    doc: str


def _kind(name: str, doc: str, *touches: str) -> Kind:
    unknown = set(touches) - set(TOUCHES)
    if unknown:
        raise ValueError(f"event kind {name}: unknown touches {sorted(unknown)}")
    return Kind(name, frozenset(touches), doc)


REGISTRY: dict[str, Kind] = {
    k.name: k
    for k in (
        _kind("bead.created", "a bead was created", BEAD, GRAPH, LISTING),
        # Its data says when its dependencies changed (`rows.Changes.dependencies`).
        _kind("bead.updated", "a bead's fields changed", BEAD),
        _kind("bead.status", "a bead's status was set", BEAD, DONE, FAILED, IN_FLIGHT),
        _kind(
            "bead.closed",
            "a bead was closed: the feeder's input",
            BEAD,
            DONE,
            FAILED,
            PROGRESS,
            IN_FLIGHT,
        ),
        _kind(
            "bead.reopened", "a closed bead was reopened", BEAD, DONE, FAILED, PROGRESS, IN_FLIGHT
        ),
        _kind(
            "bead.dispatched",
            "a bead was claimed and sent to a worker",
            BEAD,
            FAILED,
            PROGRESS,
            IN_FLIGHT,
        ),
        _kind(
            "dispatch.failed",
            "a dispatch failed; its claim released",
            BEAD,
            FAILED,
            PROGRESS,
            IN_FLIGHT,
        ),
        _kind("dispatch.ok", "the dispatcher took a bead: its worker has it", BEAD),
        _kind("dispatch.confirmed", "a dispatch with no answer: its worker reported", BEAD),
        # Settled by the catch-up (services.dispatch.recover): the claim goes back to ready.
        _kind(
            "dispatch.abandoned",
            "a claim whose process stopped before sending it was released",
            BEAD,
            FAILED,
            PROGRESS,
            IN_FLIGHT,
        ),
        _kind(
            "dispatch.released",
            "a dispatch with no answer and no word from its worker was released",
            BEAD,
            FAILED,
            PROGRESS,
            IN_FLIGHT,
        ),
        # Landed means merged: a merge makes a submitted bead done (the feeder's input too).
        _kind("bead.merged", "a bead's change was merged", BEAD, DONE, PROGRESS),
        _kind("merge.opened", "a bead's change was submitted or its CI changed", BEAD),
        _kind(
            "merge.abandoned",
            "a bead's change was closed without merge: the bead needs work again",
            BEAD,
            DONE,
            FAILED,
            PROGRESS,
            IN_FLIGHT,
        ),
        _kind("bead.parked", "the breaker parked a bead after failures in a row", BEAD),
        _kind("bead.retried", "a parked bead's failures were cleared", BEAD),
        # The bead actions (services/actions.py): each names its actor and reason.
        _kind(
            "bead.skipped",
            "a bead was closed as not needed: done for what it blocks, counted apart",
            BEAD,
            DONE,
            FAILED,
            PROGRESS,
            IN_FLIGHT,
        ),
        _kind(
            "bead.released",
            "a bead was taken from its worker, back to ready",
            BEAD,
            FAILED,
            PROGRESS,
            IN_FLIGHT,
        ),
        _kind(
            "bead.reassigned",
            "a bead was moved to another rig or worker",
            BEAD,
            FAILED,
            PROGRESS,
            IN_FLIGHT,
        ),
        _kind("worker.timed_out", "a bead's worker went silent past the timeout", BEAD, TIME),
        _kind("worker.back", "a silent worker reported again", BEAD, IN_FLIGHT),
        _kind("cooldown.ended", "a failed dispatch's cooldown ran out", BEAD, TIME),
        _kind("spin", "a bead was dispatched too often in an hour", NOTE),
        # The lines are in their own table (services.worklog); the event says how many.
        _kind("bead.log", "a bead's worker logged lines", NOTE),
        _kind("stranded.found", "the stranded scan found ready work nobody took", NOTE),
        _kind("notification", "a notice was sent to people", NOTE),
        _kind("process.restarted", "serve started a child process again after it exited", NOTE),
        _kind("convoy.created", "a convoy was created", CONVOY, TRACKING, LISTING, FEEDING),
        _kind("convoy.staged", "a convoy was staged", CONVOY, TRACKING, LISTING),
        _kind("convoy.restaged", "a staged convoy was staged again", CONVOY, TRACKING, LISTING),
        _kind("convoy.launched", "a staged convoy was launched", CONVOY, LISTING, FEEDING),
        _kind("convoy.tracked", "beads were added to a convoy", CONVOY, TRACKING, LISTING),
        _kind("convoy.untracked", "beads were removed from a convoy", CONVOY, TRACKING, LISTING),
        _kind("convoy.landed", "a convoy's work is all done", CONVOY, LISTING, FEEDING),
        _kind("convoy.closed", "a convoy was closed", CONVOY, LISTING, FEEDING),
        # A reopen by `convoy add` comes with new tracking.
        _kind(
            "convoy.reopened", "a closed convoy was reopened", CONVOY, TRACKING, LISTING, FEEDING
        ),
        _kind("convoy.imported", "convoys came from a file or a source", CONVOY, TRACKING, LISTING),
        _kind("convoy.updated", "a convoy's fields changed", CONVOY, FEEDING),
        _kind("convoy.status", "a convoy's status was set", CONVOY, FEEDING),
        _kind("convoy.paused", "a convoy was paused", CONVOY, FEEDING),
        _kind("convoy.resumed", "a paused convoy was resumed", CONVOY, FEEDING),
        _kind("convoy.escalated", "a stuck convoy was escalated to people", CONVOY),
        _kind("convoy.acknowledged", "an escalation was acknowledged", CONVOY),
        _kind("convoy.at_risk", "a convoy's forecast lands after its due time", CONVOY),
        _kind("convoy.overdue", "a convoy is past its due time and has not landed", CONVOY),
        _kind("convoy.on_track", "a convoy at risk or overdue is on track again", CONVOY),
        _kind("rig.created", "a rig was created", RIG, LISTING),
        _kind("rig.state", "a rig was parked, docked or made active", RIG, LISTING, GRAPH),
        _kind("route.changed", "the routes from prefixes to rigs changed", RIG, LISTING, GRAPH),
        _kind("capacity.changed", "the town's cap was set or lifted", CAPACITY),
    )
}


def touching(*touches: str) -> frozenset[str]:
    """The kinds that touch any of `touches`."""
    return frozenset(name for name, k in REGISTRY.items() if k.touches & set(touches))


def only(*touches: str) -> frozenset[str]:
    """The kinds that touch nothing but (some of) `touches`."""
    return frozenset(name for name, k in REGISTRY.items() if k.touches <= set(touches))


def unregistered(names: set[str] | frozenset[str] | list[str]) -> list[str]:
    """Those of `names` that are not registered, sorted."""
    return sorted(set(names) - REGISTRY.keys())


CLOSED = "bead.closed"  # its writers hand it to the cluster: queue.handle_closes_on_commit
MERGED = "bead.merged"
# What makes a bead done and so feeds what it unblocks and lands what it completes.
FEEDS = frozenset((CLOSED, MERGED))
# The kinds about one bead (and the log's notes): each changes the row of the bead it names,
# and so what that bead blocks, and nothing else.
BEAD_KINDS = (touching(BEAD) | touching(NOTE)) - touching(CONVOY, RIG, CAPACITY, TRACKING)
# Bead kinds that change nothing a convoy shows about itself.
ROW_ONLY_KINDS = BEAD_KINDS - touching(PROGRESS)
LISTING_KINDS = touching(LISTING)
GRAPH_KINDS = touching(GRAPH, TRACKING)
PROGRESS_KINDS = touching(PROGRESS)
FEEDING_KINDS = touching(FEEDING)
NOTE_KINDS = only(NOTE)
# The worker's log lines: pages tail them; they change no derived fact and no timeline.
LOG = "bead.log"
