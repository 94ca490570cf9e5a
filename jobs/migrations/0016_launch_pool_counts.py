from django.db import migrations, models
from django.db.models import Count

BATCH = 1000


def count_every_launchs_nodes_by_pool(apps, schema_editor):
    """Every launch so far gets its nodes counted by pool (a launch without nodes: {}),
    in batches of launches, each counted in SQL."""
    Attempt = apps.get_model("jobs", "Attempt")
    through = Attempt.nodes.through
    ids = list(Attempt.objects.order_by("pk").values_list("pk", flat=True))
    for start in range(0, len(ids), BATCH):
        batch = ids[start : start + BATCH]
        counts = {pk: {} for pk in batch}
        rows = (
            through.objects.filter(attempt_id__in=batch)
            .values_list("attempt_id", "node__pool")
            .annotate(n=Count("pk"))
            .order_by()
        )
        for attempt_id, pool, n in rows:
            counts[attempt_id][pool] = n
        launches = [Attempt(pk=pk, pool_counts=c) for pk, c in counts.items()]
        Attempt.objects.bulk_update(launches, ["pool_counts"])


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0015_prices_and_maintenance_windows"),
    ]

    operations = [
        migrations.AddField(
            model_name="attempt",
            name="pool_counts",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.RunPython(count_every_launchs_nodes_by_pool, migrations.RunPython.noop),
    ]
