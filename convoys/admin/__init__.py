"""Django admin: every save goes through convoys/services, so it obeys their rules and writes
their events.

A save runs in one transaction (ModelAdmin.changeform_view), the object and its inlines
together. When a service refuses (ServiceError), the exception leaves that transaction, which
rolls back everything the save wrote; the same POST is then rendered again with the refusal as
a form error. Services know nothing about forms; the admin never writes model rows itself.

`base` holds what the pages share; one module per area registers its models' pages, and
importing this package (Django's admin autodiscovery does) registers them all.
"""

from convoys.admin import beads, convoy, people, town

__all__ = ["beads", "convoy", "people", "town"]
