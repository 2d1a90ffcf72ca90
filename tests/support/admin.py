"""Django admin pages as a browser posts them."""

import pytest
from django import forms


def page_data(client, url):
    """The POST body the admin page at `url` sends when saved unchanged (form and inlines)."""
    response = client.get(url)
    assert response.status_code == 200
    forms_on_page = [response.context["adminform"].form]
    for inline in response.context["inline_admin_formsets"]:
        forms_on_page += [inline.formset.management_form, *inline.formset.forms]
    data = {"_save": "Save"}
    for form in forms_on_page:
        for name in form.fields:
            bound = form[name]
            value = bound.value()
            if isinstance(bound.field.widget, forms.CheckboxInput):
                if value:
                    data[bound.html_name] = "on"
            elif value is not None:
                data[bound.html_name] = value
    return data


def saved(response):
    """The admin redirected after a save (a form error would be a 200 re-render)."""
    if response.status_code == 200:
        form = response.context["adminform"].form
        pytest.fail(f"not saved: {form.errors.as_text()} {form.non_field_errors()}")
    assert response.status_code == 302
    return response


def form_errors(response):
    assert response.status_code == 200
    errors = []
    for field_errors in response.context["adminform"].form.errors.values():  # __all__ included
        errors += [str(e) for e in field_errors]
    for inline in response.context["inline_admin_formsets"]:
        errors += [str(e) for e in inline.formset.non_form_errors()]
        for row in inline.formset.errors:
            errors += [str(e) for errs in row.values() for e in errs]
    return errors


def bead_url(bead_id):
    return f"/admin/convoys/bead/{bead_id}/change/"
