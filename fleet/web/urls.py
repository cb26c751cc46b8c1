from django.urls import path

from fleet.web import views

urlpatterns = [
    path("", views.home, name="home"),
]
