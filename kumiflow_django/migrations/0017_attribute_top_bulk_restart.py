"""Search attribute rows say whether their run is top-level; bulk restart.

- ``RunAttribute.top``: the run has no parent (it never changes). The run
  list hides child runs: with this column in the lookup index, a list
  filtered by an attribute is read and counted from the index alone, without
  probing each run row for ``parent_id IS NULL``. The index
  ``(name, value, top, started_at, run_id)`` replaces
  ``(name, value, started_at)`` (its prefix serves the same lookups).
  Existing rows are filled in from the runs, one UPDATE.
- ``BulkOperation.from_step`` and ``definition``: a bulk restart's step path
  and definition, kept with the operation so that an interrupted one
  continues with them.

Reversible: the backward migration drops the columns and puts the old index
back.
"""

from django.apps.registry import Apps
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor


def fill_top(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """Mark the rows of child runs (the default says top-level)."""
    RunAttribute = apps.get_model("kumiflow", "RunAttribute")
    WorkflowRun = apps.get_model("kumiflow", "WorkflowRun")
    children = WorkflowRun.objects.using(schema_editor.connection.alias).filter(
        parent_id__isnull=False
    )
    RunAttribute.objects.using(schema_editor.connection.alias).filter(
        run_id__in=children.values("id")
    ).update(top=False)


class Migration(migrations.Migration):
    dependencies = [
        ("kumiflow", "0016_search_attributes_approvals"),
    ]

    operations = [
        migrations.AddField(
            model_name="runattribute",
            name="top",
            field=models.BooleanField(default=True, verbose_name="top-level run"),
        ),
        migrations.RunPython(fill_top, migrations.RunPython.noop, elidable=True),
        migrations.RemoveIndex(
            model_name="runattribute",
            name="kumiflow_attr_lookup_idx",
        ),
        migrations.AddIndex(
            model_name="runattribute",
            index=models.Index(
                fields=["name", "value", "top", "-started_at", "run_id"],
                name="kumiflow_attr_top_idx",
            ),
        ),
        migrations.AddField(
            model_name="bulkoperation",
            name="from_step",
            field=models.CharField(
                blank=True, default="", max_length=200, verbose_name="from step"
            ),
        ),
        migrations.AddField(
            model_name="bulkoperation",
            name="definition",
            field=models.CharField(
                blank=True, default="", max_length=10, verbose_name="definition"
            ),
        ),
    ]
