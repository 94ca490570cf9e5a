"""Incident.State.MITIGATING is gone: nothing ever set it. Rows in that state (seeded
by hand or by a benchmark) are still being worked on: they become open."""

from django.db import migrations, models


def mitigating_to_open(apps, schema_editor):
    Incident = apps.get_model("incidents", "Incident")
    Incident.objects.filter(state="mitigating").update(state="open")


class Migration(migrations.Migration):
    dependencies = [
        ("incidents", "0005_detector_failures_and_sweep_state"),
    ]

    operations = [
        migrations.RunPython(mitigating_to_open, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="incident",
            name="state",
            field=models.CharField(
                choices=[("open", "Open"), ("recovered", "Recovered"), ("resolved", "Resolved")],
                default="open",
                max_length=12,
            ),
        ),
    ]
