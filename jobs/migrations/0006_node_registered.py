from django.db import migrations, models


def registered_when_set_by_a_person(apps, schema_editor):
    """Rows made before this field, by ingest or by a person, cannot be told apart:
    the active ones count toward the cluster's size while they are heard from (as a
    node ingest names does); a node put in another state (a spare, in repair) was
    set so by an operator or by recovery, and stays counted."""
    Node = apps.get_model("jobs", "Node")
    Node.objects.filter(state="active").update(registered=False)


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0005_received_times"),
    ]

    operations = [
        migrations.AddField(
            model_name="node",
            name="registered",
            field=models.BooleanField(default=True),
        ),
        migrations.RunPython(registered_when_set_by_a_person, migrations.RunPython.noop),
    ]
