"""When a convoy will land, with its spread, and what that says of its due time. Pure: no
Django.

The forecast resamples the convoy's own bead durations (dispatch to close; else its rigs'):
the work left takes `steps` beads one after another, the longer of the remaining critical path
and the remaining beads spread over the convoy's width (how many run at once), and each
step's time is drawn from the samples. `ROUNDS` draws of the sum give its 50th and 90th
percentiles. The draws are seeded by the convoy's id, so one convoy's forecast is the same
on every page and in every process for the same samples.
"""

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

ROUNDS = 400
LEAST_OWN = 3  # a convoy's own bead times it takes as its samples; with fewer, its rigs'
WIDER = 500  # the rigs' most recent bead times taken then
ON_TRACK, AT_RISK, OVERDUE, LANDED_ON_TIME, LANDED_LATE = (
    "on-track",
    "at-risk",
    "overdue",
    "landed-on-time",
    "landed-late",
)
DEADLINE_STATES = (ON_TRACK, AT_RISK, OVERDUE, LANDED_ON_TIME, LANDED_LATE)
WORDS = {
    ON_TRACK: "on track",
    AT_RISK: "at risk",
    OVERDUE: "overdue",
    LANDED_ON_TIME: "landed on time",
    LANDED_LATE: "landed late",
}


@dataclass(frozen=True)
class Forecast:
    p50: datetime
    p90: datetime
    steps: int  # beads one after another still to go
    samples: int
    median: float  # seconds a bead takes, the samples' median

    def as_json(self) -> dict[str, object]:
        return {
            "p50": self.p50.isoformat(),
            "p90": self.p90.isoformat(),
            "steps": self.steps,
            "samples": self.samples,
            "median_seconds": round(self.median, 1),
        }


def pool(own: Sequence[float], wider: Callable[[], Sequence[float]]) -> tuple[list[float], bool]:
    """The samples a forecast draws from, and whether they are the convoy's own: its own
    bead times when it has LEAST_OWN of them, else the wider pool's (`wider()`: its rigs'
    recent ones); a couple of quick beads say little of the one that will take a day."""
    if len(own) >= LEAST_OWN:
        return list(own), True
    return list(wider()), False


def steps_left(critical: int, remaining: int, width: int | None) -> int:
    """Beads still to run one after another: the remaining critical path, or the remaining
    beads over the width when that is longer (`width` None or 0: no limit)."""
    if remaining <= 0:
        return 0
    spread = math.ceil(remaining / width) if width else 0
    return max(critical, spread, 1)


def forecast(
    seconds: Sequence[float], steps: int, now: datetime, seed: str = ""
) -> Forecast | None:
    """The landing's 50th and 90th percentiles, or None without samples or work left."""
    if not seconds or steps <= 0:
        return None
    rng = random.Random(f"{seed}:{len(seconds)}:{steps}")
    pool = sorted(seconds)  # the same samples in any order give the same forecast
    sums = sorted(sum(rng.choices(pool, k=steps)) for _ in range(ROUNDS))
    p50 = sums[len(sums) // 2]
    p90 = sums[min(len(sums) - 1, math.ceil(0.9 * len(sums)) - 1)]
    return Forecast(
        p50=now + timedelta(seconds=p50),
        p90=now + timedelta(seconds=p90),
        steps=steps,
        samples=len(pool),
        median=statistics.median(pool),
    )


def deadline_state(
    due: datetime | None, now: datetime, found: Forecast | None, landed_at: datetime | None
) -> str:
    """What a due time says: "" (none), on-track, at-risk (the 90th percentile lands after
    it), overdue (past it, not landed), or landed on time or late."""
    if due is None:
        return ""
    if landed_at is not None:
        return LANDED_ON_TIME if landed_at <= due else LANDED_LATE
    if now > due:
        return OVERDUE
    if found is not None and found.p90 > due:
        return AT_RISK
    return ON_TRACK


def described(due: datetime, state: str, found: Forecast | None, now: datetime) -> str:
    """The due time's state in words, with the forecast it rests on: "at risk: the forecast
    lands 2026-12-24 19:10 UTC (nine times in ten by 2026-12-25 02:00 UTC)"."""
    if state == OVERDUE:
        late = now - due
        hours = late.total_seconds() / 3600
        text = f"overdue by {hours:.1f} h" if hours >= 1 else "overdue"
    else:
        text = WORDS.get(state, state)
    if found is not None and state in (ON_TRACK, AT_RISK, OVERDUE):
        text += (
            f": the forecast lands {found.p50:%Y-%m-%d %H:%M} UTC "
            f"(nine times in ten by {found.p90:%Y-%m-%d %H:%M} UTC)"
        )
    elif state in (ON_TRACK, AT_RISK):
        text += ": no forecast yet (no bead of it or its rigs has been dispatched and closed)"
    return text
