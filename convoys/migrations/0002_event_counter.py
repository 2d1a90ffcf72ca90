from django.db import migrations


def create_counter(apps, schema_editor):
    apps.get_model("convoys", "EventCounter").objects.get_or_create(name="events")


class Migration(migrations.Migration):
    dependencies = [("convoys", "0001_initial")]
    operations = [migrations.RunPython(create_counter, migrations.RunPython.noop)]
