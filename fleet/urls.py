from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from fleet.api.health import healthz
from fleet.api.metrics import metrics
from fleet.api.ready import readyz

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    path("metrics", metrics, name="metrics"),
    path("api/v1/advisor/", include("fleet.api.advisor")),
    path("api/v1/", include("fleet.api.urls")),
    path("admin/", admin.site.urls),
    path("login/", auth_views.LoginView.as_view(template_name="login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("fleet.web.urls")),
]
