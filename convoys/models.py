"""The convoy domain in rows: rigs, routes, beads and their dependencies, convoys, the event log.

Rows are written only by `convoys.services`; models hold single-object rules.

One module, though long: Django finds an app's models here, and the tables refer to one
another, so they are read together.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Self

from django.conf import settings
from django.db import models

# A skipped bead is closed as not needed: done for its dependents and for landing, counted
# and shown apart from the beads that were done (services/actions.py sets it).
from convoys.core.history import DONE_STATUSES as DONE_STATUSES
from convoys.core.history import SKIPPED as SKIPPED

# Statuses and types are free strings; these are the values the product knows.
KNOWN_STATUSES = (
    "open",
    "in_progress",
    "hooked",
    "blocked",
    "deferred",
    "pinned",
    "closed",
    "tombstone",
    SKIPPED,
)
# What a write (API, command line, admin) may set: an import keeps any status it reads, but a
# person or tool sets one the product knows (`tombstone` included: bd's deletion, done for good).
# A skip goes through its own action, which records why.
SETTABLE_STATUSES = tuple(s for s in KNOWN_STATUSES if s != SKIPPED)
ACTIVE_WORK_STATUSES = ("hooked", "in_progress")
SLINGABLE_TYPES = ("task", "bug", "feature", "chore", "")
BLOCKING_DEP_TYPES = ("blocks", "conditional-blocks", "waits-for", "merge-blocks")
MERGED_PREFIX = "Merged in "

CONVOY_OPEN = "open"
CONVOY_CLOSED = "closed"
CONVOY_STAGED_READY = "staged_ready"
CONVOY_STAGED_WARNINGS = "staged_warnings"
CONVOY_STATUSES = (CONVOY_OPEN, CONVOY_CLOSED, CONVOY_STAGED_READY, CONVOY_STAGED_WARNINGS)
STAGED_STATUSES = (CONVOY_STAGED_READY, CONVOY_STAGED_WARNINGS)
# A convoy closed with one of these landed: its work completed (or its owner landed it).
COMPLETED_REASON = "All tracked issues completed"
LANDED_REASON = "Landed by owner"
LANDED_REASONS = (COMPLETED_REASON, LANDED_REASON)


def bead_prefix(bead_id: str) -> str:
    """Text up to and including the first '-' ("hq-cv-abc" -> "hq-"); '' when there is none."""
    index = bead_id.find("-")
    return bead_id[: index + 1] if index > 0 else ""


class Rig(models.Model):
    ACTIVE, PARKED, DOCKED = "active", "parked", "docked"
    STATES = [(ACTIVE, "active"), (PARKED, "parked"), (DOCKED, "docked")]

    name = models.CharField(max_length=100, primary_key=True)
    state = models.CharField(max_length=10, choices=STATES, default=ACTIVE)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def operational(self) -> bool:
        return self.state == self.ACTIVE


class Route(models.Model):
    """Bead-id prefix -> rig, as in Gas Town's routes.jsonl. No rig means town level."""

    prefix = models.CharField(max_length=100, primary_key=True)
    path = models.CharField(max_length=500)
    rig = models.ForeignKey(Rig, null=True, blank=True, on_delete=models.SET_NULL)

    class Meta:
        ordering = ["prefix"]

    def __str__(self) -> str:
        return f"{self.prefix} -> {self.rig_id or '(town)'}"


class Bead(models.Model):
    id = models.CharField(max_length=255, primary_key=True)
    title = models.TextField()
    description = models.TextField(blank=True, default="")
    # Indexes are chosen for the queries that run (status via the composite below): every
    # extra index costs each of an import's 100,000 inserts.
    status = models.CharField(max_length=50, default="open")
    issue_type = models.CharField(max_length=50, default="task", blank=True, db_index=True)
    priority = models.IntegerField(default=2)
    assignee = models.CharField(max_length=255, blank=True, default="", db_index=True)
    owner = models.CharField(max_length=255, blank=True, default="")
    labels = models.JSONField(default=list, blank=True)
    close_reason = models.TextField(blank=True, default="")
    created_by = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)
    rig = models.ForeignKey(Rig, null=True, blank=True, on_delete=models.SET_NULL)
    # Failed dispatches in a row (reset by a good one or `beads retry`); at
    # CONVOY_MAX_DISPATCH_FAILURES the breaker is open: no path dispatches the bead.
    dispatch_failures = models.PositiveIntegerField(default=0)
    # Unknown keys of the beads record, exported again unchanged.
    extra = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["status", "issue_type"])]

    def __str__(self) -> str:
        return self.id

    @property
    def is_done(self) -> bool:
        return self.status in DONE_STATUSES

    @property
    def is_slingable(self) -> bool:
        return self.issue_type in SLINGABLE_TYPES

    @property
    def symbol(self) -> str:
        return status_symbol(self.status)

    @property
    def sourced(self) -> SourcedRecord | None:
        """Its SourcedRecord when it came from a `beads sync` source, else None."""
        return SourcedRecord.objects.filter(pk=self.pk).first()


def status_symbol(status: str) -> str:
    """One symbol per state on every page, the CLI and e-mail: ✓ done, ⤼ skipped (closed as
    not needed), ◐ submitted (closed, waiting to merge), ▶ in progress,
    ● ready (`status` "ready": the readiness rule said so), ? unknown, ○ blocked."""
    if status == SKIPPED:
        return "⤼"
    if status in DONE_STATUSES:
        return "✓"
    if status == "submitted":  # closed, waiting for its merge
        return "◐"
    if status in ACTIVE_WORK_STATUSES:
        return "▶"
    if status == "ready":
        return "●"
    if status == "unknown":
        return "?"
    return "○"


class Dependency(models.Model):
    """`issue` depends on `depends_on_id`. The target may be absent from the database."""

    # Lookups by issue use the unique constraint's index, by target the (target, type) one.
    issue = models.ForeignKey(
        Bead, related_name="dependencies", on_delete=models.CASCADE, db_index=False
    )
    depends_on_id = models.CharField(max_length=255)
    raw_target = models.CharField(max_length=300, blank=True, default="")
    type = models.CharField(max_length=50, default="blocks")
    created_at = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=255, blank=True, default="")
    metadata = models.TextField(blank=True, default="")
    extra = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issue", "depends_on_id"], name="unique_dependency")
        ]
        # Walking an epic and finding dependents follow (target, type).
        indexes = [models.Index(fields=["depends_on_id", "type"], name="dep_target_type")]
        verbose_name_plural = "dependencies"

    def __str__(self) -> str:
        return f"{self.issue_id} -[{self.type}]-> {self.depends_on_id}"


class Convoy(models.Model):
    MERGE_STRATEGIES = ("direct", "mr", "local")

    id = models.CharField(max_length=64, primary_key=True)
    title = models.TextField()
    description = models.TextField(blank=True, default="")
    status = models.CharField(max_length=20, default=CONVOY_OPEN, db_index=True)
    owner = models.CharField(max_length=255, blank=True, default="")
    notify = models.CharField(max_length=1000, blank=True, default="")
    merge_strategy = models.CharField(max_length=10, blank=True, default="")
    base_branch = models.CharField(max_length=255, blank=True, default="")
    molecule = models.CharField(max_length=255, blank=True, default="")
    owned = models.BooleanField(default=False)
    max_in_flight = models.PositiveIntegerField(null=True, blank=True)
    # Dispatches owed by closes that found the convoy's drain busy; the drain pays them.
    feed_credit = models.PositiveIntegerField(default=0)
    created_by = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)
    close_reason = models.TextField(blank=True, default="")
    completion_notified_at = models.DateTimeField(null=True, blank=True)
    # Paused: no path dispatches its beads (the claim reads this) until resumed.
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_by = models.CharField(max_length=255, blank=True, default="")
    pause_reason = models.TextField(blank=True, default="")
    labels = models.JSONField(default=list, blank=True)
    extra = models.JSONField(default=dict, blank=True)
    # When it should have landed; `deadline` is the state its owners were last told of
    # ("" none or on track, "at-risk", "overdue": `services.deadlines`).
    due_at = models.DateTimeField(null=True, blank=True)
    deadline = models.CharField(max_length=10, blank=True, default="")

    class Meta:
        ordering = ["-created_at", "id"]

    def __str__(self) -> str:
        return f"{self.id}: {self.title}"

    @property
    def sourced(self) -> SourcedRecord | None:
        """Its SourcedRecord when its record came from a `beads sync` source, else None."""
        return SourcedRecord.objects.filter(pk=self.pk).first()

    @property
    def is_staged(self) -> bool:
        return self.status in STAGED_STATUSES

    @property
    def state(self) -> str:
        """Its status for people: "landed" for a convoy closed by its work completing."""
        return "landed" if self.landed else self.status

    @property
    def landed(self) -> bool:
        """Closed because its work completed (or its owner landed it), not closed by hand."""
        return self.status == CONVOY_CLOSED and self.close_reason in LANDED_REASONS

    def notify_addresses(self) -> list[str]:
        """Owner, then notify addresses, de-duplicated in that order."""
        seen = []
        for address in [self.owner, *self.notify.split(",")]:
            address = address.strip()
            if address and address not in seen:
                seen.append(address)
        return seen


class TrackedBead(models.Model):
    """Convoy -> bead tracking: non-blocking; the bead may not be in the database."""

    convoy = models.ForeignKey(Convoy, related_name="tracked", on_delete=models.CASCADE)
    bead_id = models.CharField(max_length=255, db_index=True)
    raw_target = models.CharField(max_length=300, blank=True, default="")
    position = models.PositiveIntegerField(default=0)
    extra = models.JSONField(default=dict, blank=True)
    # Kept by the projection with the convoy's graph: the bead's dispatch wave (1, 2, …), 0
    # when a gate holds it back, None when it is in no wave (not work, not in the store).
    wave = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["position", "id"]
        constraints = [
            models.UniqueConstraint(fields=["convoy", "bead_id"], name="unique_tracking")
        ]
        indexes = [
            models.Index(fields=["convoy", "wave"], name="tracked_wave"),
            # a page of a convoy's beads in order, read without sorting the convoy
            models.Index(fields=["convoy", "position", "id"], name="tracked_order"),
        ]

    def __str__(self) -> str:
        return f"{self.convoy_id} tracks {self.bead_id}"


class EventCounter(models.Model):
    """One row whose update serialises event writers: seq is gap-free in commit order."""

    name = models.CharField(max_length=20, primary_key=True)
    value = models.BigIntegerField(default=0)


class Event(models.Model):
    """The append-only log: feeder input, audit history, browser replay source."""

    seq = models.BigIntegerField(primary_key=True)
    kind = models.CharField(max_length=40)
    bead_id = models.CharField(max_length=255, blank=True, default="", db_index=True)
    convoy_id = models.CharField(max_length=64, blank=True, default="", db_index=True)
    actor = models.CharField(max_length=255, blank=True, default="")
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["seq"]

    def __str__(self) -> str:
        return f"#{self.seq} {self.kind} {self.bead_id or self.convoy_id}"


class Worker(models.Model):
    """A worker (`<rig>/polecats/<name>`) and when it last reported."""

    name = models.CharField(max_length=255, primary_key=True)
    rig = models.CharField(max_length=100, blank=True, default="")
    last_seen = models.DateTimeField()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Dispatch(models.Model):
    """One dispatch attempt: who, by which path, and how it went."""

    PATHS = ("launch", "event", "stranded", "manual", "batch")
    # "": the dispatcher's own answer (or none yet); "abandoned": the claim's process stopped
    # before calling it; "released": called, but no answer and no heartbeat in time;
    # "confirmed": no answer, but the worker reported.
    RESOLUTIONS = ("", "abandoned", "released", "confirmed")

    bead_id = models.CharField(max_length=255, db_index=True)
    convoy_id = models.CharField(max_length=64, blank=True, default="", db_index=True)
    rig = models.CharField(max_length=100, blank=True, default="")
    worker = models.CharField(max_length=255, blank=True, default="")
    path = models.CharField(max_length=20)
    # `sling --force` sent the bead past open blockers.
    forced = models.BooleanField(default=False)
    ok = models.BooleanField(null=True)  # None: no outcome recorded (yet)
    # Crash safety (`services.dispatch.recover`): when the dispatcher was called, until when
    # the process holding the claim may still record its outcome, and how an attempt without
    # one was settled (RESOLUTIONS).
    started_at = models.DateTimeField(null=True, blank=True)
    held_until = models.DateTimeField(null=True, blank=True)
    resolution = models.CharField(max_length=20, blank=True, default="")
    error = models.TextField(blank=True, default="")
    output = models.TextField(blank=True, default="")
    duration_ms = models.FloatField(null=True, blank=True)
    # A close's feed: from the close event to this claim (the metrics' latency histogram).
    since_close_ms = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "dispatches"
        indexes = [
            models.Index(
                fields=["held_until"],
                condition=models.Q(ok__isnull=True, resolution=""),
                name="dispatch_unresolved",
            )
        ]

    def __str__(self) -> str:
        return f"{self.bead_id} -> {self.worker} ({self.path})"


class Cursor(models.Model):
    """A persisted high-water mark over the event log (e.g. the catch-up feeder's)."""

    name = models.CharField(max_length=40, primary_key=True)
    position = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)


class HandledEvent(models.Model):
    """Idempotency marker: a close event handled by the feeder (unique per event). A handler
    that died before `finished` is taken over once CONVOY_TASK_TIMEOUT has passed."""

    seq = models.BigIntegerField(primary_key=True)
    handled_at = models.DateTimeField(auto_now_add=True)
    finished = models.BooleanField(default=True)


class Lease(models.Model):
    """A time-bounded lock taken with one conditional update (ticks, scans, drains)."""

    name = models.CharField(max_length=120, primary_key=True)
    holder = models.CharField(max_length=120, blank=True, default="")
    expires_at = models.DateTimeField()


class SyncSource(models.Model):
    """A bd source `beads sync` reads (a file path or `cmd:<command line>`) and how its
    passes went: the last good one, and the error of the failure streak it is in, if any."""

    name = models.CharField(max_length=500, primary_key=True)
    last_pass_at = models.DateTimeField(null=True, blank=True)
    records = models.IntegerField(default=0)
    changed = models.IntegerField(default=0)
    # Records its last good pass took from another source (the newest source wins).
    taken = models.IntegerField(default=0)
    # Records its last good pass did not take: their ids are local beads or convoys.
    conflicts = models.IntegerField(default=0)
    seconds = models.FloatField(default=0.0)  # how long its last good pass took
    error = models.TextField(blank=True, default="")
    failing_since = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name


class SourcedRecord(models.Model):
    """A bead or convoy that came from a sync source: a digest of its record as last read
    (content, computed counts left out) and since when the source no longer has it."""

    id = models.CharField(max_length=255, primary_key=True)
    source = models.CharField(max_length=500, db_index=True)
    digest = models.CharField(max_length=32)
    # A hash of the line it was last read from: a pass skips the lines it finds here.
    line = models.CharField(max_length=32, blank=True, default="", db_index=True)
    # A digest of the fields a dispatch claim writes (status, assignee) as the source last
    # showed them: a claim of ours stands while the source still shows them so ("" unknown).
    claimed = models.CharField(max_length=32, blank=True, default="")
    missing_since = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.id

    @classmethod
    def of(cls, ids: Iterable[str]) -> dict[str, Self]:
        """{id: SourcedRecord} of those of `ids` that came from a sync source."""
        return cls.objects.in_bulk(list(ids))


class SyncMemo(models.Model):
    """What the last good pass over a sync source read, for the next pass in any process
    (convoys/services/bdsync/): the chunks of the source, good while the token it names is
    the one every writing pass sets anew."""

    source = models.CharField(max_length=500, primary_key=True)
    token = models.BigIntegerField()
    chunks = models.BinaryField()

    def __str__(self) -> str:
        return self.source


class Subscription(models.Model):
    """A user's wish to hear about one convoy, or about every convoy (convoy empty)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    convoy = models.ForeignKey(Convoy, null=True, blank=True, on_delete=models.CASCADE)
    email = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "convoy"], name="unique_subscription"),
            models.UniqueConstraint(
                fields=["user"],
                condition=models.Q(convoy__isnull=True),
                name="unique_all_subscription",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} -> {self.convoy_id or 'all convoys'}"


class Notification(models.Model):
    LANDED, DISPATCHED, CLOSED = "landed", "dispatched", "closed"
    # Someone must act (a parked bead, a stuck convoy); every other kind is a receipt.
    ACTION_NEEDED, ESCALATION = "action_needed", "escalation"
    AT_RISK, OVERDUE = "at_risk", "overdue"  # its forecast lands after its due time; past it
    ACTION_KINDS = (ACTION_NEEDED, ESCALATION, AT_RISK, OVERDUE)

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE
    )
    address = models.CharField(max_length=255, blank=True, default="")
    convoy = models.ForeignKey(Convoy, null=True, on_delete=models.CASCADE)
    kind = models.CharField(max_length=20)
    subject = models.CharField(max_length=600)
    body = models.TextField()
    created_at = models.DateTimeField(db_index=True)
    read_at = models.DateTimeField(null=True, blank=True)
    email_wanted = models.BooleanField(default=False)
    emailed_at = models.DateTimeField(null=True, blank=True)
    # The user takes this kind as a daily digest: no toast, no e-mail of its own; the next
    # digest e-mail lists it (and stamps digested_at).
    digest = models.BooleanField(default=False)
    digested_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.subject

    @property
    def action_needed(self) -> bool:
        return self.kind in self.ACTION_KINDS


class ApiToken(models.Model):
    """A bearer token for tools and workers; only its SHA-256 is stored. It stops working at
    `expires_at` (never when empty) and when its user's password changes (it is deleted)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    name = models.CharField(max_length=100)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)  # to the minute (services/tokens)

    def __str__(self) -> str:
        return f"{self.name} ({self.user})"


class Memory(models.Model):
    """A bd memory (`bd remember`): a `_type: "memory"` line of a bd export, kept by the
    import and written again, as it came, by the export."""

    key = models.CharField(max_length=255, primary_key=True)
    value = models.TextField()
    line = models.TextField()  # the JSON line as it was imported

    class Meta:
        ordering = ["key"]
        verbose_name_plural = "memories"

    def __str__(self) -> str:
        return self.key


class DeliveryPreference(models.Model):
    """How one user hears about each kind of notification (no row: the defaults).

    immediate: toast, browser notification and an e-mail (with an address on the account);
    in_app: toast and browser notification only (a subscription's "e-mail too" still mails
    that convoy's receipts); digest (receipts only): quietly in the inbox, and one e-mail a
    day listing them."""

    IMMEDIATE, IN_APP, DIGEST = "immediate", "in_app", "digest"
    ACTION_CHOICES = [(IMMEDIATE, "immediately, with an e-mail"), (IN_APP, "in the app only")]
    RECEIPT_CHOICES = [
        (IMMEDIATE, "immediately, with an e-mail"),
        (IN_APP, "in the app only"),
        (DIGEST, "in a daily digest e-mail"),
    ]

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, primary_key=True, on_delete=models.CASCADE
    )
    action_needed = models.CharField(max_length=10, choices=ACTION_CHOICES, default=IMMEDIATE)
    receipts = models.CharField(max_length=10, choices=RECEIPT_CHOICES, default=IN_APP)
    # The last digest e-mail sent (claimed with one conditional update, so one per day).
    last_digest_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.user}: action needed {self.action_needed}, receipts {self.receipts}"


class Escalation(models.Model):
    """A convoy that made no progress for CONVOY_STUCK_AFTER seconds, and how far its
    escalation went: `count` notifications (the first and at most two re-escalations) about
    the stall that began at `progress_at`. Acknowledging stops it; progress starts afresh."""

    convoy = models.OneToOneField(
        Convoy, primary_key=True, on_delete=models.CASCADE, related_name="escalation"
    )
    progress_at = models.DateTimeField()  # the last progress before this stall
    count = models.PositiveIntegerField(default=0)
    escalated_at = models.DateTimeField()  # the last notification
    causes = models.JSONField(default=list, blank=True)  # the lines named, as sent
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.CharField(max_length=255, blank=True, default="")

    def __str__(self) -> str:
        return f"{self.convoy_id} escalated {self.count}x"


class TownSetting(models.Model):
    """An operator's run-time setting for the whole town, by name (`convoy capacity --set N`
    writes "max-in-flight"): read at every use, so every process obeys a change at its next
    event, with no restart. No row: the environment's value holds."""

    name = models.CharField(max_length=60, primary_key=True)
    value = models.IntegerField()
    set_by = models.CharField(max_length=255, blank=True, default="")
    set_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name} = {self.value}"


class ConvoyVisit(models.Model):
    """When a user last opened a convoy's page ("since your last visit"): the event sequence
    number the page showed, and when."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    convoy_id = models.CharField(max_length=64)
    seq = models.BigIntegerField(default=0)
    at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "convoy_id"], name="unique_convoy_visit")
        ]


class Merge(models.Model):
    """A bead's change on its way into the target branch, one row per bead: open (submitted,
    waiting to merge), merged or abandoned. Written by `services.merges` from the bead store's
    merge-request beads and from forge webhooks; a convoy merging by `mr` counts a closed bead
    done only once its row says merged."""

    OPEN, MERGED, ABANDONED = "open", "merged", "abandoned"
    STATES = (OPEN, MERGED, ABANDONED)

    bead_id = models.CharField(max_length=255, primary_key=True)
    state = models.CharField(max_length=10, default=OPEN)
    source = models.CharField(max_length=20)  # bd, github, gitlab, gitea, api, cli
    ref = models.CharField(max_length=255, blank=True, default="")  # a commit, "PR #12", an MR id
    link = models.TextField(blank=True, default="")
    branch = models.CharField(max_length=255, blank=True, default="")
    target = models.CharField(max_length=255, blank=True, default="")
    ci = models.CharField(
        max_length=20, blank=True, default=""
    )  # the forge's CI: pending, success…
    reason = models.TextField(blank=True, default="")  # why it was abandoned
    opened_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.bead_id}: {self.state}"


class ForgeDelivery(models.Model):
    """A forge webhook delivery seen once: a redelivery with the same id changes nothing."""

    forge = models.CharField(max_length=10)
    delivery = models.CharField(max_length=255)
    received_at = models.DateTimeField()
    outcome = models.TextField(blank=True, default="")  # what it did, in a line

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["forge", "delivery"], name="unique_forge_delivery")
        ]


# --- the read model: derived facts kept with the event log (convoys/read/projection.py) ----------
class BeadFacts(models.Model):
    """What the rules say about one bead, refreshed in the transaction of every event that may
    change it (and by the ticker's time events); `manage.py convoy reproject` rebuilds it."""

    bead_id = models.CharField(max_length=255, primary_key=True)
    segment = models.CharField(
        max_length=10
    )  # done | skipped | submitted | active | failed | ready | blocked
    ready = models.BooleanField(default=False)  # the readiness rule
    feedable = models.BooleanField(default=False)  # ready, not cooling down, not parked
    failed = models.BooleanField(default=False)  # its last dispatch failed
    open_blockers = models.PositiveIntegerField(default=0)
    worker_dead = models.BooleanField(default=False)  # assigned, and its worker is silent
    dead_at = models.DateTimeField(null=True, blank=True)  # when its worker counts as dead
    cooldown_until = models.DateTimeField(null=True, blank=True)  # a failed dispatch's cooldown
    # Why it is not moving (`causes.decide`'s kind, "" when done), the town's and the convoys'
    # capacity aside: a bead past the free slots is kept as "ready" (pages ask the queue).
    cause = models.CharField(max_length=30, blank=True, default="")
    # The last line its worker logged (services.worklog keeps it; no rule derives it, so a
    # rebuild leaves it as it is): the convoy page shows it beside a bead in progress.
    last_log = models.TextField(blank=True, default="")
    seq = models.BigIntegerField(default=0)  # the event that last refreshed it

    class Meta:
        indexes = [
            models.Index(fields=["dead_at"], name="beadfacts_dead_at"),
            models.Index(fields=["cooldown_until"], name="beadfacts_cooldown"),
        ]


class ConvoyFacts(models.Model):
    """A convoy's counts by segment, last activity and stranded verdict, kept with the log."""

    convoy_id = models.CharField(max_length=64, primary_key=True)
    done = models.PositiveIntegerField(default=0)
    skipped = models.PositiveIntegerField(default=0)  # closed as not needed: not done
    submitted = models.PositiveIntegerField(default=0)  # closed, waiting to merge (`mr`)
    active = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    ready = models.PositiveIntegerField(default=0)
    blocked = models.PositiveIntegerField(default=0)
    unknown = models.PositiveIntegerField(default=0)
    total = models.PositiveIntegerField(default=0)
    dispatchable = models.PositiveIntegerField(default=0)
    last_activity = models.DateTimeField(null=True, blank=True)
    verdict = models.CharField(max_length=10, blank=True, default="")  # stranding's kinds
    code = models.CharField(max_length=30, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    # Since when it has had ready work nobody claimed (kept while it stays feedable): pages
    # call it stranded only once that is older than one feed interval.
    feedable_since = models.DateTimeField(null=True, blank=True)
    causes = models.JSONField(default=dict, blank=True)  # {kind: n} of the beads not done
    # Per wave (1, 2, …): {segment: n, "total": n, "causes": {kind: n}}; gated beads apart.
    waves = models.JSONField(default=list, blank=True)
    gated = models.JSONField(default=dict, blank=True)  # the same for the gated beads
    critical = models.JSONField(default=list, blank=True)  # the critical path's beads not done
    graph_seq = models.BigIntegerField(default=0)  # the event that last changed its graph
    seq = models.BigIntegerField(default=0)


# --- outbound webhooks and chat (convoys/services/hooks.py) -------------------------------------
class WebhookTarget(models.Model):
    """Where events go out: a signed webhook (an http(s) URL) or a chat (an Apprise URL), for
    one user's own convoys, one convoy, or the whole town, and the kinds it asked for."""

    USER, CONVOY, TOWN = "user", "convoy", "town"
    SCOPES = (USER, CONVOY, TOWN)

    url = models.TextField()
    secret = models.CharField(max_length=120)  # whsec_… (Standard Webhooks)
    scope = models.CharField(max_length=10)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="webhook_targets",
    )
    convoy = models.ForeignKey(Convoy, null=True, blank=True, on_delete=models.CASCADE)
    kinds = models.CharField(max_length=200)  # ",landed,closed," (core.webhooks.stored_kinds)
    created_by = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField()
    active = models.BooleanField(default=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.pk}: {self.url[:60]}"

    @property
    def owner(self) -> str:
        """What the target is for, in a word: a username, a convoy id or "town"."""
        if self.scope == self.USER:
            return self.user.get_username() if self.user is not None else ""
        return (self.convoy_id or "") if self.scope == self.CONVOY else "town"


class WebhookDelivery(models.Model):
    """One event sent to one target: its body as sent every time, and how its attempts went.
    The row is the state: a restarted cluster retries what is due from here."""

    target = models.ForeignKey(WebhookTarget, on_delete=models.CASCADE, related_name="deliveries")
    event_id = models.CharField(max_length=64)  # webhook-id: the same for every retry
    kind = models.CharField(max_length=20)
    body = models.JSONField()
    created_at = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=0)
    status_code = models.IntegerField(null=True, blank=True)
    latency_ms = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True, db_index=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    gave_up_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["target", "event_id"], name="unique_webhook_delivery")
        ]

    def __str__(self) -> str:
        return f"{self.event_id} -> {self.target_id}"

    @property
    def state(self) -> str:
        if self.delivered_at:
            return "delivered"
        if self.gave_up_at:
            return "gave up"
        return "retrying" if self.attempts else "queued"


# --- the worker's own words and saved views ------------------------------------------------
class LogLine(models.Model):
    """One line a bead's worker logged (`services.worklog`): appended, and the oldest dropped
    once a bead holds more than CONVOY_LOG_LINES lines or CONVOY_LOG_BYTES bytes."""

    bead_id = models.CharField(max_length=255)
    text = models.TextField()
    size = models.PositiveIntegerField()  # its length in UTF-8 bytes
    actor = models.CharField(max_length=255, blank=True, default="")
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["bead_id", "id"], name="logline_bead")]


class SavedView(models.Model):
    """A page's filters saved under a name by one user (`services.views`): the dashboard's or
    the stranded page's query string. Opened by its id, it shows anyone who may see the page
    the same filters; one per user and page may be the default."""

    PAGES = ("dashboard", "stranded")

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    page = models.CharField(max_length=20)
    name = models.CharField(max_length=80)
    query = models.TextField(blank=True, default="")
    default = models.BooleanField(default=False)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["user", "page", "name"], name="unique_saved_view"),
            models.UniqueConstraint(
                fields=["user", "page"],
                condition=models.Q(default=True),
                name="one_default_view",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.page}: {self.name}"
