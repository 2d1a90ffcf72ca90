"""Pages that create and fix work: a bead or an epic with children, a dependency from a bead's
page, and on a staged convoy's page its re-check and the un-parking of a rig it waits on.

Forms validate shapes; every rule is the services' and a refusal is shown as a form error
(HTTP 400), with nothing written.
"""

from typing import Any, cast

from django import forms
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from convoys.core.formatting import several
from convoys.models import SLINGABLE_TYPES, Bead, Convoy, Rig
from convoys.services import authoring, feeding, rigs
from convoys.services import beads as bead_service
from convoys.services.errors import NotFound, ServiceError
from convoys.web.access import actor, back, needs, refusal

BEAD_TYPES = [t for t in SLINGABLE_TYPES if t] + ["decision"]
PRIORITIES = [(p, f"P{p}") for p in range(5)]
DEPENDENCY_TYPES = (
    "blocks",
    "waits-for",
    "conditional-blocks",
    "merge-blocks",
    "parent-child",
    "related",
)


class CreateForm(forms.Form):
    kind = forms.ChoiceField(
        choices=[("bead", "A bead"), ("epic", "An epic with children")],
        initial="bead",
        widget=forms.RadioSelect,
    )
    # A field named like the form's own `prefix` attribute: the form metaclass moves fields
    # into base_fields, so BaseForm.prefix (None, set per instance) is untouched.
    prefix = forms.ChoiceField(label="Rig (the id's prefix)")  # type: ignore[assignment]
    title = forms.CharField(max_length=500)
    issue_type = forms.ChoiceField(
        label="Type (of a bead; an epic's children are tasks)",
        choices=[(t, t) for t in BEAD_TYPES],
        initial="task",
    )
    priority = forms.TypedChoiceField(choices=PRIORITIES, coerce=int, initial=2)
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False)
    children = forms.CharField(
        label="Children (epic), one per line",
        widget=forms.Textarea(attrs={"rows": 6, "placeholder": "Design\nBuild | after 1\n"}),
        required=False,
        help_text="End a line with “| after 1, 2” to make it wait for earlier lines "
        "(or for existing beads by id). Children are created as tasks.",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cast(forms.ChoiceField, self.fields["prefix"]).choices = [
            (prefix, f"{rig} ({prefix}…)") for prefix, rig in authoring.rig_prefixes()
        ]


@needs("convoys.add_bead")
def create(request: HttpRequest) -> HttpResponse:
    """Create a bead, or an epic with children and dependencies; ids come from the prefix."""
    form = CreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            if data["kind"] == "epic":
                created, children = authoring.create_epic(
                    data["title"],
                    prefix=data["prefix"],
                    children_text=data["children"],
                    description=data["description"],
                    priority=data["priority"],
                    actor=actor(request),
                )
                note = f" with {len(children)} children" if children else ""
            else:
                if data["children"].strip():
                    raise ServiceError("children belong to an epic: choose “An epic”")
                authoring.check_prefix(data["prefix"])
                created = bead_service.create_bead(
                    data["title"],
                    prefix=data["prefix"],
                    issue_type=data["issue_type"],
                    priority=data["priority"],
                    description=data["description"],
                    actor=actor(request),
                )
                note = ""
        except ServiceError as exc:
            said = refusal(exc)
            # A refusal about the children's lines goes beside that field, named by its label.
            form.add_error("children" if said.startswith(("line ", "children")) else None, said)
        else:
            messages.success(request, f"Created {created.id}{note}.")
            return redirect("bead", created.id)
    status = 400 if form.errors else 200
    return render(request, "convoys/create.html", {"form": form}, status=status)


class DependencyForm(forms.Form):
    target = forms.CharField(label="Depends on (bead id)", max_length=300)
    type = forms.ChoiceField(
        choices=[(t, t) for t in DEPENDENCY_TYPES],
        initial="blocks",
        help_text="blocks: waits until that bead is done; parent-child: a child of that epic.",
    )


@needs("convoys.change_bead")
def add_dependency(request: HttpRequest, bead_id: str) -> HttpResponse:
    """`bead_id` depends on a target (blocks by default); GET shows the form alone."""
    bead = Bead.objects.filter(pk=bead_id).first()
    if bead is None:
        raise Http404(f"bead '{bead_id}' not found")
    form = DependencyForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            dep = bead_service.add_dependency(
                bead.pk, form.cleaned_data["target"], form.cleaned_data["type"], actor(request)
            )
        except ServiceError as exc:
            form.add_error(None, refusal(exc))
        else:
            messages.success(request, f"{bead.pk} now depends on {dep.depends_on_id} ({dep.type}).")
            return redirect("bead", bead.pk)
    status = 400 if form.errors else 200
    return render(
        request, "convoys/dependency_form.html", {"bead": bead, "form": form}, status=status
    )


@require_POST
@needs("convoys.change_convoy")
def recheck(request: HttpRequest, convoy_id: str) -> HttpResponse:
    """Re-stage a staged convoy in place and say what changed (an open one is checked: it
    lands if complete, else the page says what it waits for)."""
    convoy = Convoy.objects.filter(pk=convoy_id).first()
    if convoy is None:
        raise Http404(f"convoy '{convoy_id}' not found")
    try:
        ok, line = feeding.check_report(convoy.pk, actor=actor(request))
    except ServiceError as exc:
        messages.error(request, refusal(exc))
    else:
        (messages.success if ok else messages.warning)(request, line)
    return redirect("convoy", convoy.pk)


@require_POST
@needs("convoys.change_rig")
def restore_rig(request: HttpRequest, name: str) -> HttpResponse:
    """Un-park (or undock) a rig; the staged convoys waiting on it are re-checked."""
    try:
        before = set(Convoy.objects.filter(status="staged_ready").values_list("pk", flat=True))
        rig = rigs.set_rig_state(name, Rig.ACTIVE, actor=actor(request))
    except NotFound as exc:
        raise Http404(str(exc))
    except ServiceError as exc:
        messages.error(request, refusal(exc))
    else:
        ready = Convoy.objects.filter(status="staged_ready").exclude(pk__in=before).count()
        note = f"; {several(ready, 'staged convoy')} now ready to launch" if ready else ""
        messages.success(request, f"Rig {rig.name} is active{note}.")
    return back(request, reverse("dashboard"))
