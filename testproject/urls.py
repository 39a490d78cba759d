from django.contrib import admin
from django.urls import include, path

from testproject import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/kumiflow/", include("kumiflow_django.http.urls")),
    path("demo/astart/", views.astart),
]
