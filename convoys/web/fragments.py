"""Pages made of named fragments, so that a live page equals a reload by construction.

A page's template includes one small template per part that changes (`convoys/_*.html`); each
part's root element carries the fragment's id. A live request for the same URL (`X-Live: 1`
or `?fragments=a,b`) renders those same templates from the same read model and answers JSON
`{"seq": n, "fragments": {id: html}}`: the page replaces each element by id. `X-Live-Since:
<seq>` (the sequence number the page shows) lets a view answer only what changed after it.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.template import RequestContext, Template
from django.template.backends.django import Template as BackendTemplate
from django.template.loader import get_template
from django.utils.cache import patch_vary_headers

from convoys.core.parsing import whole_number

UNREAD = "unread"


@dataclass
class Fragment:
    """A part of a page: its element id and the template that draws it (with extra context),
    or `html` already drawn by Python (the DAG's nodes and overlay)."""

    id: str
    template: str = ""
    context: dict[str, Any] = field(default_factory=dict)
    html: str | None = None


def unread() -> Fragment:
    """The inbox badge in the navigation bar: part of every page."""
    return Fragment(UNREAD, "convoys/_unread.html")


def is_live(request: HttpRequest) -> bool:
    return request.headers.get("X-Live") == "1" or "fragments" in request.GET


def since(request: HttpRequest) -> int | None:
    """The sequence number a live request's page shows, or None (answer every fragment; and
    for a request that is not live, draw the whole page)."""
    if not is_live(request):
        return None
    # A sequence number is a bigint: anything else (or too big for one) means "everything".
    return whole_number(request.headers.get("X-Live-Since"))


def respond(
    request: HttpRequest,
    template: str,
    context: dict[str, Any],
    fragments: Sequence[Fragment] | Callable[[], Sequence[Fragment]],
) -> HttpResponse:
    """The full page, or for a live request the fragments (a list, or a callable returning
    one, called only for live requests) rendered with the page's context."""
    if not is_live(request):
        response = render(request, template, context)
    else:
        if callable(fragments):
            fragments = fragments()
        names = request.GET.get("fragments", "")
        if names:
            wanted = set(names.split(","))
            fragments = [f for f in fragments if f.id in wanted]
        response = JsonResponse(
            {"seq": context["as_of"], "fragments": render_fragments(request, context, fragments)}
        )
        response["Cache-Control"] = "no-store"
    patch_vary_headers(response, ["X-Live", "X-Live-Since"])
    return response


def render_fragments(
    request: HttpRequest, context: dict[str, Any], fragments: Sequence[Fragment]
) -> dict[str, str]:
    """{id: html}; context processors run once for all of them."""
    if not fragments:
        return {}
    out = {f.id: f.html for f in fragments if f.html is not None}
    drawn = [f for f in fragments if f.html is None]
    if not drawn:
        return out
    templates = {f.template: _django_template(f.template) for f in drawn}
    bound = RequestContext(request, context)
    with bound.bind_template(templates[drawn[0].template]):
        for fragment in drawn:
            with bound.push(fragment.context):
                # Only the element: the whitespace around it stays in the page as it was.
                out[fragment.id] = templates[fragment.template].render(bound).strip()
    return out


def _django_template(name: str) -> Template:
    """The engine's Template inside the Django backend's wrapper, to render with one bound
    RequestContext (the stubs' engine-neutral wrapper does not name `.template`)."""
    return cast(BackendTemplate, get_template(name)).template
