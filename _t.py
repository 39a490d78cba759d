import django, time, statistics; django.setup()
from django.test import Client
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
u,_ = get_user_model().objects.get_or_create(username="bench", defaults={"is_staff": True, "is_superuser": True})
c = Client(); c.force_login(u)
url="/admin/kumiflow/workflowrun/?attr=tier:gold"
c.get(url)
for _ in range(3):
    with CaptureQueriesContext(connection) as q:
        c.get(url)
    print([(round(float(x["time"])*1000,1), x["sql"][:300]) for x in q.captured_queries if float(x["time"])>0.02])
