"""The search page: beads, epics, convoys and rigs found by id, title, labels, people or
description (convoys/read/search.py), ranked and a page at a time."""

from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from convoys.core.parsing import whole_number
from convoys.read import search
from convoys.web.access import viewer
from convoys.web.context import page_context


@viewer
def search_page(request: HttpRequest) -> HttpResponse:
    q = request.GET.get("q", "")
    raw_offset = request.GET.get("offset", "")
    offset = whole_number(raw_offset, search.MAX_OFFSET) if raw_offset else 0
    if offset is None:
        problem = f"offset: a whole number up to {search.MAX_OFFSET} ({raw_offset[:20]!r} given)"
        back = f"{request.path}?{urlencode({'q': q})}"
        context = {"problem": problem, "page_name": "search page", "back": back}
        return render(request, "convoys/bad_filter.html", context, status=422)
    found = search.search(q, offset=offset)
    context = page_context(request) | {"found": found, "q": q}
    return render(request, "convoys/search.html", context)
