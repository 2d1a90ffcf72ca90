"""Saved views from the page itself: open one by its link (shared: anyone who may see the
page), save the page's filters under a name, rename, delete, make one the default."""

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from convoys.read.saved_views import PAGE_URLS, shared
from convoys.services import savedviews
from convoys.services.errors import ServiceError
from convoys.web.access import AuthenticatedHttpRequest, back, refusal, viewer

# A page opened with this asks for no default view: every convoy, as without saved views.
NO_DEFAULT = "all=1"


def page_url(page: str, query: str) -> str:
    """The page showing these filters (no filters: the page without its default)."""
    return f"{reverse(PAGE_URLS[page])}?{query or NO_DEFAULT}"


@require_GET
@viewer
def open_view(request: HttpRequest, view_id: int) -> HttpResponse:
    view = shared(view_id)
    if view is None:
        raise Http404(f"saved view {view_id} not found")
    return HttpResponseRedirect(page_url(view.page, view.query))


@require_POST
@viewer
def save_view(request: AuthenticatedHttpRequest) -> HttpResponse:
    page = request.POST.get("page", "")
    fallback = reverse(PAGE_URLS.get(page, "dashboard"))
    try:
        saved = savedviews.save(
            request.user, page, request.POST.get("name", ""), request.POST.get("query", "")
        )
    except ServiceError as exc:
        messages.error(request, refusal(exc))
        return back(request, fallback)
    verb = "Saved" if saved.created else "Updated"
    messages.success(request, f"{verb} the view “{saved.view.name}”.")
    return HttpResponseRedirect(page_url(saved.view.page, saved.view.query))


@require_POST
@viewer
def change_view(request: AuthenticatedHttpRequest, view_id: int, action: str) -> HttpResponse:
    user = request.user
    try:
        if action == "rename":
            view = savedviews.rename(user, view_id, request.POST.get("name", ""))
            messages.success(request, f"Renamed the view to “{view.name}”.")
        elif action == "delete":
            name = savedviews.delete(user, view_id)
            messages.success(request, f"Deleted the view “{name}”.")
        elif action == "default":
            on = request.POST.get("on") == "1"
            view = savedviews.set_default(user, view_id, on)
            words = "is now your default" if on else "is no longer your default"
            messages.success(request, f"“{view.name}” {words}.")
        else:
            raise Http404("unknown action")
    except ServiceError as exc:
        messages.error(request, refusal(exc))
    return back(request, reverse("dashboard"))
