from django.db import migrations, models


class Migration(migrations.Migration):
    """Pause a convoy (who, when, why) and a bead's failed dispatches in a row (the breaker)."""

    dependencies = [
        ("convoys", "0008_sync_sources"),
    ]

    operations = [
        migrations.AddField(
            model_name="bead",
            name="dispatch_failures",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="convoy",
            name="paused_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="convoy",
            name="paused_by",
            field=models.CharField(blank=True, default="", max_length=255),
        ),
        migrations.AddField(
            model_name="convoy",
            name="pause_reason",
            field=models.TextField(blank=True, default=""),
        ),
    ]
