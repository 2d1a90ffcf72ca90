"""The convoy page's story over time: the time slider's step and the visit report (JSON for
static/convoys/history.js). Thin: read models in convoys/read/timeline.py, the replay in
convoys/core/history.py, the visit write in services/visits.py."""

from types import SimpleNamespace

from django.http import Http404, HttpRequest, JsonResponse
from django.template.loader import render_to_string
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from convoys.core import formatting
from convoys.core.parsing import whole_number
from convoys.log.events import last_seq
from convoys.models import Convoy
from convoys.read import convoy_page, graph, sizes, snapshots, timeline
from convoys.services import visits
from convoys.web.access import AuthenticatedHttpRequest, viewer


def _convoy(convoy_id: str) -> Convoy:
    convoy = Convoy.objects.filter(pk=convoy_id).first()
    if convoy is None:
        raise Http404(f"convoy '{convoy_id}' not found")
    return convoy


def _number(value: str | None, name: str) -> int | JsonResponse:
    """The whole number in `value`, or the 400 answer saying it is not one."""
    number = whole_number(value)
    if number is None:
        return JsonResponse({"detail": f"{name} must be a whole number ≥ 0"}, status=400)
    return number


@require_GET
@viewer
def step(request: HttpRequest, convoy_id: str) -> JsonResponse:
    """`?step=N`: the page's progress after the N-th event of the convoy's stream."""
    number = _number(request.GET.get("step"), "step")
    if isinstance(number, JsonResponse):
        return number
    convoy = _convoy(convoy_id)
    now = timezone.now()
    # The beads, edges and waves of the convoy as they are now.
    snapshot = snapshots.load(convoy, now)
    _, _, dag, waves, gated = graph.convoy_graph(convoy, snapshot)
    result = timeline.step(convoy, snapshot, dag, waves, number)
    if result is None:
        return JsonResponse({"detail": "this convoy has no events yet"}, status=404)
    # A big convoy's page lists a window of its waves (an overview): so does its past.
    overview = len(snapshot.tracked) > sizes.OVERVIEW_AT
    bands, wave_pages, wpage = (
        convoy_page.band_window(result.waves, result.frontier, request.GET.get("wpage"))
        if overview
        else (result.waves, 1, 1)
    )
    page = SimpleNamespace(
        waves=result.waves,
        bands=bands,
        wave_pages=wave_pages,
        wpage=wpage,
        overview=overview,
        opened=[],
        frontier=result.frontier,
        gated=gated,
        summary_line=f"As after event #{result.seq}.",
    )
    html = render_to_string("convoys/_convoy_waves.html", {"page": page}, request=request)
    bar = render_to_string("convoys/_bar.html", {"s": result.counts}, request=request)
    response = JsonResponse(
        {
            "step": result.step,
            "steps": result.steps,
            "seq": result.seq,
            "at": result.at.isoformat(),
            "kind": result.kind,
            "what": formatting.event_words(result.kind),
            "bead": result.bead_id,
            "counts": result.counts,
            "states": result.states,
            "fragments": {"wave-card": html.strip()},
            "bar": bar.strip(),  # the head's progress bar as it was
        }
    )
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@viewer
def visit(request: AuthenticatedHttpRequest, convoy_id: str) -> JsonResponse:
    """The page reports it was shown as of `seq`: answers the beads changed since this user's
    previous visit (and records this one)."""
    seq = _number(request.POST.get("seq"), "seq")
    if isinstance(seq, JsonResponse):
        return seq
    convoy = _convoy(convoy_id)
    seq = min(seq, last_seq())
    previous = visits.visit(request.user, convoy, seq, timezone.now())
    since = timeline.since_visit(convoy, previous, seq)
    if since is None:
        return JsonResponse({"previous": None, "changed": []})
    shown = since.beads[: timeline.SINCE_CHIPS]
    return JsonResponse(
        {
            "previous": {"at": since.at.isoformat(), "seq": since.seq},
            "changed": since.beads,
            "shown": shown,
            "hidden": len(since.beads) - len(shown),
        }
    )
