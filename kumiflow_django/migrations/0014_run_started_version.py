"""The version a run started on (``WorkflowRun.started_version``).

A deploy may now carry a run on to another definition
(``kumiflow.workflow.definition-switched``), which moves ``workflow_version``;
resolvers that branch on the version the run started on read this column.
Every run so far started on the version it still has: the column is filled
from ``workflow_version`` (one UPDATE), and emptied again on the way back.
"""

from django.apps.registry import Apps
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.models import F


def fill(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    WorkflowRun = apps.get_model("kumiflow", "WorkflowRun")
    alias = schema_editor.connection.alias
    WorkflowRun.objects.using(alias).exclude(workflow_version="").update(
        started_version=F("workflow_version")
    )


class Migration(migrations.Migration):
    dependencies = [
        ("kumiflow", "0013_worker_process"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowrun",
            name="started_version",
            field=models.CharField(
                blank=True, default="", max_length=50, verbose_name="started on version"
            ),
            preserve_default=False,
        ),
        migrations.RunPython(fill, migrations.RunPython.noop, elidable=True),
    ]
