"""The three roles (Viewer, Operator, Admin) as auth groups; what each grants is stated once, in
convoys.services.roles. Running it again, or on a database migrated from scratch (before
Django's post_migrate has made any permission), gives the same groups."""

from django.db import migrations

from convoys.services import roles


def install(apps, schema_editor):
    roles.install(apps, schema_editor.connection.alias)


class Migration(migrations.Migration):

    dependencies = [
        ('auth', '0012_alter_user_first_name_max_length'),
        ('contenttypes', '0002_remove_content_type_name'),
        ('convoys', '0021_close_handler_finished'),
    ]

    # Backwards the groups stay (their users keep them); forwards again resets them.
    operations = [migrations.RunPython(install, migrations.RunPython.noop)]
