"""Node rows leave room on their pages (PostgreSQL): ingest rewrites a node's last
heartbeat every few seconds, and an update that fits on its row's page, touching no
indexed column, writes no index entry and is pruned without a vacuum (a HOT update)."""

from django.db import migrations

NODE_FILLFACTOR = 50


def leave_room(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE jobs_node SET (fillfactor = {NODE_FILLFACTOR})")


def fill_up(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE jobs_node RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0013_ledger_announced_revision"),
    ]

    operations = [migrations.RunPython(leave_room, fill_up)]
