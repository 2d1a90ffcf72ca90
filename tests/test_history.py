"""The convoy's story over time: the pure replay (convoys/core/history.py), its
property (replaying every event gives today's statuses and page states), the timeline, the
slider's step and "since your last visit" over HTTP."""

from datetime import UTC, datetime, timedelta

import hypothesis
import pytest
from django.db import transaction
from django.urls import reverse
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from convoys.core import history
from convoys.infra.dispatchers import Outcome
from convoys.models import Bead, Convoy, ConvoyVisit, Event
from convoys.read import snapshots, timeline
from convoys.rules.readiness import ready_beads
from convoys.services import beads, dispatch, staging
from convoys.services.launch import launch_staged

from .support.factories import blocks, epic_of
from .support.users import signed_in

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def ev(seq, kind, bead_id="", convoy_id="", minutes=0, **data):
    return history.Ev(seq, kind, bead_id, convoy_id, T0 + timedelta(minutes=minutes), data)


# --- pure ------------------------------------------------------------------------------------
def test_spans_mark_the_idle_gap_between_ready_and_taken():
    blocking = {"b": [("a", "blocks")]}
    events = [
        ev(1, "bead.created", "a", status="open", assignee=""),
        ev(2, "bead.created", "b", status="open", assignee=""),
        ev(3, "convoy.launched", "", "c1", minutes=1),
        ev(4, "bead.dispatched", "a", "c1", minutes=1, status="hooked", assignee="w1"),
        ev(5, "bead.closed", "a", minutes=5, status="closed", assignee="w1", close_reason="ok"),
        ev(6, "bead.dispatched", "b", "c1", minutes=9, status="hooked", assignee="w2"),
        ev(7, "bead.closed", "b", minutes=12, status="closed", assignee="w2"),
    ]
    spans = history.spans(events, ["a", "b"], blocking, "c1")
    phases = {
        b: [(s.phase, s.start.minute, s.end and s.end.minute) for s in v] for b, v in spans.items()
    }
    assert phases["a"] == [("waiting", 0, 1), ("active", 1, 5), ("done", 5, None)]
    # b became ready when a closed (minute 5) and nobody took it until minute 9: the idle gap.
    assert phases["b"] == [
        ("waiting", 0, 5),
        ("ready", 5, 9),
        ("active", 9, 12),
        ("done", 12, None),
    ]


def test_states_after_any_event_and_merge_blocks():
    blocking = {"b": [("a", "merge-blocks")], "c": [("ghost", "blocks")]}
    events = [
        ev(1, "bead.created", "a", status="open"),
        ev(2, "bead.created", "b", status="open"),
        ev(3, "bead.created", "c", status="open"),
        ev(4, "bead.closed", "a", status="closed", close_reason="Closed"),
        ev(5, "bead.reopened", "a", status="open"),
        ev(6, "bead.closed", "a", status="closed", close_reason="Merged in main"),
    ]
    beads_ = ["a", "b", "c", "d"]
    assert history.states(events, beads_, blocking, upto=3) == {
        "a": "ready",
        "b": "blocked",
        "c": "ready",
        "d": "unknown",  # a target never seen: no block
    }
    assert history.states(events, beads_, blocking, upto=4)["b"] == "blocked"  # not merged
    assert history.states(events, beads_, blocking, upto=5)["a"] == "ready"
    assert history.states(events, beads_, blocking)["b"] == "ready"


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.sampled_from(["open", "hooked", "in_progress", "closed"])),
        max_size=30,
    )
)
def test_spans_are_consecutive_and_end_in_the_current_phase(moves):
    blocking = {"b1": [("b0", "blocks")], "b2": [("b0", "blocks"), ("b1", "blocks")]}
    events = [ev(i + 1, "bead.created", f"b{i}", status="open") for i in range(4)]
    events.append(ev(5, "convoy.launched", "", "c", minutes=1))
    for n, (i, status) in enumerate(moves):
        events.append(ev(6 + n, "bead.status", f"b{i}", minutes=2 + n, status=status, assignee=""))
    spans = history.spans(events, ["b0", "b1", "b2", "b3"], blocking, "c")
    run = history.replay(events, blocking, "c")
    for bead_id, items in spans.items():
        assert items and items[-1].end is None and items[-1].phase == run.phase(bead_id)
        for one, two in zip(items, items[1:], strict=False):
            assert one.end == two.start and one.phase != two.phase and one.start < one.end


# --- the property over the real services -----------------------------------------------------
class Refuses:
    def dispatch(self, bead_id, rig, convoy_id, worker):
        return Outcome(ok=False, error="worker refused")


OPS = st.lists(
    st.tuples(
        st.sampled_from(["close", "reopen", "progress", "assign", "unassign", "open", "fail"]),
        st.integers(0, 5),
    ),
    max_size=25,
)


@pytest.mark.slow
@pytest.mark.django_db
@hypothesis.settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(edges=st.sets(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=8), ops=OPS)
def test_replaying_all_events_equals_the_current_state(routes, edges, ops):
    with transaction.atomic():
        ids = [f"gt-h{i}" for i in range(6)]
        epic_of("gt-hepic", ids)
        for a, b in edges:
            if a < b:  # a DAG: lower blocks higher
                blocks(ids[a], ids[b])
        plan = staging.stage(["gt-hepic"], actor="test")
        launch_staged(plan.convoy_id, force=True, actor="test")
        for op, i in ops:
            row = Bead.objects.get(pk=ids[i])
            try:
                if op == "close" and row.status != "closed":
                    beads.close_bead(row.id, actor="test", force=True)
                elif op == "reopen" and row.status == "closed":
                    beads.reopen_bead(row.id, actor="test")
                elif op == "progress":
                    beads.update_bead(row.id, status="in_progress", actor="test")
                elif op == "open":
                    beads.update_bead(row.id, status="open", actor="test")
                elif op == "assign":
                    beads.update_bead(row.id, assignee="gastown/polecats/x", actor="test")
                elif op == "unassign":
                    beads.update_bead(row.id, assignee="", actor="test")
                elif op == "fail":  # claimed (hooked), then the worker refuses: open again
                    claim = dispatch.claim(row, convoy_id=plan.convoy_id)
                    if claim is not None:
                        dispatch.run(claim, dispatcher=Refuses())
            except Exception as exc:  # a refused move changes nothing
                refusals = ("cannot", "already", "not closed", "needs an assignee")
                assert any(words in str(exc) for words in refusals), exc
        convoy = Convoy.objects.get(pk=plan.convoy_id)
        snapshot = snapshots.load(convoy, datetime.now(UTC))
        events = timeline.events(timeline.stream(convoy))
        run = history.replay(events, timeline.blocking_edges(snapshot.edges), convoy.pk)
        assert {b: run.status.get(b) for b in ids} == {
            b.id: b.status for b in Bead.objects.filter(pk__in=ids)
        }
        ready = set(ready_beads(Bead.objects.filter(pk__in=ids)).values_list("pk", flat=True))
        assert {b for b in ids if run.state(b) == "ready"} == ready
        transaction.set_rollback(True)


# --- over HTTP -------------------------------------------------------------------------------
@pytest.fixture
def launched(routes):
    epic_of("gt-tepic", ["gt-t1", "gt-t2", "gt-t3"])
    blocks("gt-t1", "gt-t2")
    blocks("gt-t2", "gt-t3")
    plan = staging.stage(["gt-tepic"], actor="test")
    launch_staged(plan.convoy_id, force=True, actor="test")
    beads.close_bead("gt-t1", actor="test")
    beads.update_bead("gt-t2", status="in_progress", assignee="gastown/polecats/w", actor="test")
    return Convoy.objects.get(pk=plan.convoy_id)


@pytest.mark.django_db
def test_convoy_page_draws_the_timeline_and_a_live_update_equals_it(launched):
    client = signed_in("viewer", "view_convoy")
    url = reverse("convoy", args=[launched.pk])
    page = client.get(url).content.decode()
    assert 'id="gantt-card"' in page and 'id="history-slider"' in page
    # The frontier wave (2: gt-t2 is worked on) by default; wave 1 on demand.
    assert 'data-wave="2"' in page and 'class="g-active"' in page and 'class="g-ready"' in page
    live = client.get(url, HTTP_X_LIVE="1").json()["fragments"]["gantt-card"]
    assert live.startswith('<section class="card" id="gantt-card"')
    drawn = page[page.index('<section class="card" id="gantt-card"') :]
    assert live == drawn[: drawn.index("</section>")] + "</section>"
    wave1 = client.get(url + "?twave=1").content.decode()
    assert 'data-wave="1"' in wave1 and 'data-bead="gt-t1"' in wave1 and 'class="g-done"' in wave1
    assert client.get(url + "?twave=99").status_code == 200  # an unknown wave: the frontier


@pytest.mark.django_db
def test_slider_step_is_the_page_as_after_that_event(launched):
    client = signed_in("viewer", "view_convoy")
    url = reverse("convoy-history", args=[launched.pk])
    stream = [(e.seq, e.kind, e.bead_id) for e in timeline.events(timeline.stream(launched))]
    last = client.get(url, {"step": len(stream)}).json()
    assert last["states"] == {"gt-t1": "done", "gt-t2": "active", "gt-t3": "blocked"}
    assert last["counts"]["done"] == 1 and last["seq"] == stream[-1][0]
    assert last["counts"]["percent_complete"] == 33 and 'class="seg done"' in last["bar"]
    closed_at = next(n for n, (_, kind, b) in enumerate(stream, 1) if kind == "bead.closed")
    before = client.get(url, {"step": closed_at - 1}).json()
    assert before["states"]["gt-t1"] == "active"
    assert 'id="wave-card"' in before["fragments"]["wave-card"]
    assert client.get(url, {"step": "x"}).json() == {"detail": "step must be a whole number ≥ 0"}
    assert client.get(url, {"step": "-1"}).status_code == 400
    assert client.get(url, {"step": 10**6}).json()["step"] == len(stream)  # clamped


@pytest.mark.django_db
def test_since_last_visit_names_the_beads_changed_in_between(launched):
    client = signed_in("viewer", "view_convoy")
    url = reverse("convoy-visit", args=[launched.pk])
    seq = Event.objects.order_by("-seq").first().seq
    assert client.post(url, {"seq": seq}).json() == {"previous": None, "changed": []}
    beads.close_bead("gt-t2", actor="test")
    seq2 = Event.objects.order_by("-seq").first().seq
    answer = client.post(url, {"seq": seq2}).json()
    assert answer["previous"]["seq"] == seq
    assert "gt-t2" in answer["changed"] and "gt-t1" not in answer["changed"]
    assert client.post(url, {"seq": seq2}).json()["changed"] == []
    assert client.post(url, {"seq": "1; drop"}).status_code == 400
    assert ConvoyVisit.objects.get(convoy_id=launched.pk).seq == seq2
