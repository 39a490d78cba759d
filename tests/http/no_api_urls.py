"""A URLconf without the API: live streams are not mounted."""

urlpatterns: list[object] = []
