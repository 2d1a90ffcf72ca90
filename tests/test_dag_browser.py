"""The convoy DAG in Chromium: geometry as drawn (no edge passes through a box other than its
endpoints) on real epics (gt-si8rq, bd-f8b764c9 from ../shared) and generated ones; the demo's
gate drawn and named; ghosts, marks and the legend; hover and keyboard focus highlight a
bead's chains; "Focus on" centres; pan and zoom by mouse, touch and keys; live icons."""

import io
import random

import pytest
from django.core.management import call_command
from django.utils import timezone

from convoys.infra import bulk
from convoys.models import Bead, Convoy, Dependency, TrackedBead
from convoys.services import beads, convoys, jsonl, rigs
from convoys.services.launch import launch_staged

from .support.browser import login, shot, wait_js
from .support.factories import bead, blocks, child, stage
from .support.paths import shared_file
from .support.users import full_staff

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# Every edge path sampled every 2 px against every box but its two ends (shrunk by 1.5 px).
GEOMETRY = """() => {
  const svg = document.querySelector("#dag svg");
  const boxes = [];
  svg.querySelectorAll("g.node").forEach((g) => {
    const m = g.transform.baseVal.consolidate().matrix;
    const b = g.querySelector("rect, polygon").getBBox();
    boxes.push([g.dataset.id || "", m.e + b.x, m.f + b.y, b.width, b.height]);
  });
  const hits = [];
  const edges = svg.querySelectorAll("g.edges path.edge");
  edges.forEach((p) => {
    const ends = [p.dataset.from, p.dataset.to];
    const length = p.getTotalLength();
    for (let s = 0; s <= length; s += 2) {
      const pt = p.getPointAtLength(s);
      for (const [id, x, y, w, h] of boxes) {
        if (ends.includes(id)) continue;
        if (pt.x > x + 1.5 && pt.x < x + w - 1.5 && pt.y > y + 1.5 && pt.y < y + h - 1.5) {
          hits.push(`${ends[0]} -> ${ends[1]} passes through ${id}`);
          return;
        }
      }
    }
  });
  return { edges: edges.length, nodes: boxes.length, hits };
}"""

VIEWBOX = "() => document.querySelector('#dag svg').getAttribute('viewBox').split(' ').map(Number)"


def geometry_ok(page, url):
    page.goto(url)
    page.wait_for_selector("#dag svg g.node")
    found = page.evaluate(GEOMETRY)
    assert found["hits"] == [], found["hits"][:10]
    return found


def test_real_epics_draw_no_edge_through_a_box(browser, server, routes):
    jsonl.import_file(shared_file("steveyegge+gastown+issues.jsonl"))
    jsonl.import_file(shared_file("steveyegge+beads+issues@ce622f5.jsonl"))
    full_staff("ann")
    context, page = login(browser, server, "ann")
    for epic in ("gt-si8rq", "bd-f8b764c9"):  # bd-f8b764c9 is all closed: tracked, not staged
        convoy = convoys.create(f"Epic {epic}", from_epic=epic, actor="test")
        found = geometry_ok(page, server + f"/convoys/{convoy.pk}/")
        assert found["edges"] >= 5 and found["nodes"] >= 10, (epic, found)
        shot(page, f"dag-{epic}")
    context.close()


def generated_epic(rng, size, prefix="gt-g"):
    ids = [bead(f"{prefix}{i:03d}", f"Generated {i}").id for i in range(size)]
    for index, bead_id in enumerate(ids[1:], start=1):
        for blocker in rng.sample(ids[:index], k=min(index, rng.choice((1, 1, 2, 3)))):
            blocks(blocker, bead_id)  # any earlier bead: many edges span several waves
    return ids


def test_generated_epics_draw_no_edge_through_a_box(browser, server, routes):
    rng = random.Random(14)
    full_staff("ann")
    context, page = login(browser, server, "ann")
    for n, size in enumerate((12, 40)):
        ids = generated_epic(rng, size, prefix=f"gt-g{n}x")
        beads.add_dependency(ids[-1], "gt-nowhere", "blocks", actor="test")
        beads.add_dependency(ids[1], "external:beads:bd-abc", "blocks", actor="test")
        found = geometry_ok(page, server + f"/convoys/{stage(ids)}/")
        assert found["edges"] >= size
        ghosts = page.locator("#dag g.node.ghost")
        assert sorted(ghosts.evaluate_all("(gs) => gs.map((g) => g.getAttribute('class'))")) == [
            "node ghost external",  # bd-abc, written external:beads:bd-abc
            "node ghost unknown",  # gt-nowhere
        ]
        assert (
            "external:beads:bd-abc" in page.locator('#dag g.node[data-id="bd-abc"]').text_content()
        )
        assert page.locator('#dag path.edge.ghost[data-from="gt-nowhere"]').count() == 1
    shot(page, "dag-generated")
    context.close()


def test_a_400_bead_convoy_with_long_edges_draws_none_through_a_box(browser, server, routes):
    rng, now = random.Random(400), timezone.now()
    ids = [f"gt-big{i:03d}" for i in range(400)]
    seed = bead("gt-seed")  # a bead made by the services: its rig is the route's
    beads_rows = [
        {
            "id": bead_id,
            "title": f"Big {n}",
            "status": rng.choice(["open", "open", "closed", "hooked"]),
            "issue_type": "task",
            "priority": 2,
            "created_at": now,
            "updated_at": now,
            "rig_id": seed.rig_id,
        }
        for n, bead_id in enumerate(ids)
    ]
    deps = [
        {"issue_id": ids[n], "depends_on_id": ids[rng.randrange(n)], "type": "blocks"}
        for n in range(1, 400)
        for _ in range(rng.choice((1, 1, 2)))
    ]
    bulk.insert(Bead, beads_rows)
    bulk.insert(Dependency, [dict(t) for t in {tuple(d.items()) for d in deps}])
    Convoy.objects.create(
        id="hq-cv-big", title="Big", status="open", created_at=now, updated_at=now
    )
    bulk.insert(
        TrackedBead,
        [{"convoy_id": "hq-cv-big", "bead_id": b, "position": n} for n, b in enumerate(ids)],
    )
    full_staff("ann")
    context, page = login(browser, server, "ann")
    found = geometry_ok(page, server + "/convoys/hq-cv-big/?expand=1")
    assert found["nodes"] == 400 and found["edges"] >= 400
    context.close()


def test_the_demo_gate_is_drawn_and_named_with_its_edge(browser, server):
    call_command("demo", stdout=io.StringIO())
    convoy = Convoy.objects.get(title__contains="Gated: production rollout")
    full_staff("ann")
    context, page = login(browser, server, "ann")
    page.goto(server + f"/convoys/{convoy.pk}/")
    gate = page.locator("#dag g.node.gate")
    assert gate.count() == 1
    assert "Decide: go / no-go" in gate.text_content()
    gate_id = gate.get_attribute("data-id")
    roll = page.locator(f'#dag path.edge[data-from="{gate_id}"]')
    assert roll.count() == 1
    rolled = roll.get_attribute("data-to")
    assert page.locator(f'#dag-overlay .mark.gated[data-id="{rolled}"]').text_content() == "⊘"
    assert page.evaluate(GEOMETRY)["hits"] == []
    legend = page.inner_text("#dag-legend")
    for words in ("gate or decision", "external target", "critical path", "⊘ gated", "⚠ stranded"):
        assert words in legend
    shot(page, "dag-gated")
    context.close()


@pytest.fixture
def chain(routes):
    """a -> b -> c -> d, a -> d, x alone: launched."""
    bead("gt-epic", "Chain", type="epic")
    for bead_id in ("gt-ca", "gt-cb", "gt-cc", "gt-cd", "gt-cx"):
        bead(bead_id, f"Step {bead_id[-1]}")
        child("gt-epic", bead_id)
    for a, b in (("gt-ca", "gt-cb"), ("gt-cb", "gt-cc"), ("gt-cc", "gt-cd"), ("gt-ca", "gt-cd")):
        blocks(a, b)
    convoy_id = stage(["gt-epic"])
    launch_staged(convoy_id, force=True, actor="test")
    return convoy_id


def test_hover_and_keyboard_focus_highlight_the_chain(browser, server, chain):
    full_staff("ann")
    context, page = login(browser, server, "ann")
    page.goto(server + f"/convoys/{chain}/")
    page.wait_for_selector("#dag svg g.node")
    page.hover('#dag g.node[data-id="gt-cc"]')
    lit = page.evaluate(
        "() => [...document.querySelectorAll('#dag .nodes g.node.hl')].map((g) => g.dataset.id).sort()"
    )
    assert lit == ["gt-ca", "gt-cb", "gt-cc", "gt-cd"]  # x is neither up nor downstream
    assert page.locator("#dag .hl-layer .veil").count() == 1  # the rest is veiled
    copies = (
        "() => [...document.querySelectorAll('#dag .hl-layer g.node')].map((g) => g.dataset.id)"
    )
    assert sorted(page.evaluate(copies)) == lit  # the chain is drawn above the veil
    assert page.locator('#dag .edges .edge.hl[data-from="gt-ca"][data-to="gt-cd"]').count() == 0
    assert page.locator('#dag .edges .edge.hl[data-from="gt-cb"][data-to="gt-cc"]').count() == 1
    page.mouse.move(5, 5)
    assert page.locator("#dag .hl-layer").count() == 0
    assert page.locator("#dag .hl").count() == 0
    page.focus("#n-gt-ca")  # keyboard focus on the link
    assert page.locator('#dag .nodes g.node.hl-focus[data-id="gt-ca"]').count() == 1
    assert page.locator("#dag .nodes g.node.hl").count() == 4  # a, b, c, d
    critical = page.evaluate(
        "() => getComputedStyle(document.querySelector('#dag-overlay .edge.critical')).stroke"
    )
    assert critical not in ("rgb(198, 40, 40)", "rgb(239, 83, 80)")  # not the alarm red
    context.close()


def test_focus_centres_the_bead_and_an_unknown_id_says_so(browser, server, routes):
    ids = generated_epic(random.Random(3), 30, prefix="gt-f")
    convoy_id = stage(ids)
    full_staff("ann")
    context, page = login(browser, server, "ann")
    target = ids[17]
    page.goto(server + f"/convoys/{convoy_id}/?focus={target}")
    page.wait_for_selector(f'#dag g.node.hl-focus[data-id="{target}"]')
    x, y, w, h = page.evaluate(VIEWBOX)
    node = page.evaluate(
        f"() => {{ const m = document.querySelector('#dag g.node[data-id=\"{target}\"]')"
        ".transform.baseVal.consolidate().matrix; return [m.e + 95, m.f + 20]; }"
    )
    assert abs(x + w / 2 - node[0]) < 2 and abs(y + h / 2 - node[1]) < 2
    assert page.locator("#focus-missing").count() == 0
    shot(page, "dag-focused")
    page.goto(server + f"/convoys/{convoy_id}/?focus=gt-nosuch")
    assert "No bead “gt-nosuch” in this convoy's graph" in page.inner_text("#focus-missing")
    assert page.locator("#dag g.node").count() == 30  # the whole graph still drawn
    context.close()


TOUCH = """([kind, id, x, y]) => {
  const target = kind === "pointerdown" ? document.querySelector("#dag svg") : window;
  target.dispatchEvent(new PointerEvent(kind, { pointerId: id, pointerType: "touch",
    clientX: x, clientY: y, bubbles: true, isPrimary: id === 1 }));
}"""


def test_pan_and_zoom_by_mouse_touch_and_keys(browser, server, routes):
    ids = generated_epic(random.Random(5), 30, prefix="gt-p")
    convoy_id = stage(ids)
    full_staff("ann")
    context, page = login(browser, server, "ann")
    page.goto(server + f"/convoys/{convoy_id}/")
    page.wait_for_selector("#dag svg g.node")
    home = page.evaluate(VIEWBOX)
    page.focus("#dag")
    page.keyboard.press("+")
    zoomed = page.evaluate(VIEWBOX)
    assert zoomed[2] < home[2]
    page.keyboard.press("ArrowRight")
    assert page.evaluate(VIEWBOX)[0] > zoomed[0]
    page.keyboard.press("ArrowDown")
    assert page.evaluate(VIEWBOX)[1] > zoomed[1]
    page.keyboard.press("0")
    assert page.evaluate(VIEWBOX) == home
    box = page.locator("#dag").bounding_box()
    page.mouse.move(box["x"] + 40, box["y"] + box["height"] - 8)
    page.mouse.wheel(0, -300)
    assert page.evaluate(VIEWBOX)[2] < home[2]
    page.keyboard.press("0")
    # drag with the mouse on the background (the top left corner, above the column labels)
    page.mouse.move(box["x"] + 110, box["y"] + 3)
    page.mouse.down()
    page.mouse.move(box["x"] + 10, box["y"] + 3, steps=5)
    page.mouse.up()
    assert page.evaluate(VIEWBOX)[0] > home[0]
    page.keyboard.press("0")
    # touch: one finger pans, two fingers pinch
    cx, cy = box["x"] + 200, box["y"] + 40
    for event in (
        ["pointerdown", 1, cx, cy],
        ["pointermove", 1, cx - 50, cy],
        ["pointerup", 1, cx - 50, cy],
    ):
        page.evaluate(TOUCH, event)
    assert page.evaluate(VIEWBOX)[0] > home[0]
    page.keyboard.press("0")
    for event in (
        ["pointerdown", 1, cx - 20, cy],
        ["pointerdown", 2, cx + 20, cy],
        ["pointermove", 1, cx - 60, cy],
        ["pointermove", 2, cx + 60, cy],
        ["pointerup", 1, cx - 60, cy],
        ["pointerup", 2, cx + 60, cy],
    ):
        page.evaluate(TOUCH, event)
    assert page.evaluate(VIEWBOX)[2] < home[2] * 0.6  # spread 40 -> 120 px: zoomed in 3x
    context.close()


def test_icons_and_classes_change_live(browser, server, chain):
    full_staff("ann")
    context, page = login(browser, server, "ann")
    page.goto(server + f"/convoys/{chain}/")
    wait_js(
        page,
        "window.convoyLive && window.convoyLive.socket && window.convoyLive.socket.readyState === 1",
    )

    def node(bead_id):
        return page.evaluate(
            f"() => {{ const g = document.querySelector('#dag g.node[data-id=\"{bead_id}\"]');"
            " return [g.getAttribute('class'), g.querySelector('.icon').textContent]; }"
        )

    assert node("gt-ca") == ["node st-active", "▶"]
    assert node("gt-cb")[1] == "○"
    navigated = []
    page.on("framenavigated", lambda frame: navigated.append(frame.url))
    page.evaluate("() => { document.getElementById('dag').dataset.drawnHere = '1'; }")
    beads.close_bead("gt-ca", actor="test")
    wait_js(
        page, "document.querySelector('#dag g.node[data-id=\"gt-ca\"] .icon').textContent === '✓'"
    )
    assert node("gt-ca") == ["node st-done", "✓"]
    # Only the nodes changed: the page named its layout (dag.js), so the drawing stayed.
    assert page.evaluate("() => document.getElementById('dag').dataset.drawnHere") == "1"
    wait_js(
        page,
        "['●', '▶'].includes(document.querySelector('#dag g.node[data-id=\"gt-cb\"] .icon')"
        ".textContent)",
    )
    rigs.set_rig_state(Bead.objects.get(pk="gt-cd").rig_id, "parked", actor="test")
    wait_js(page, "document.querySelector('#dag-overlay .mark.parked') !== null")
    assert navigated == []
    page.hover('#dag g.node[data-id="gt-cb"]')  # the highlight still works on replaced nodes
    assert page.locator('#dag .nodes g.node.hl[data-id="gt-ca"]').count() == 1
    context.close()
