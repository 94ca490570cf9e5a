"""Incidents page (being built)."""

from django.shortcuts import render
from django.urls import path

from console.pages.common import viewer_page


@viewer_page
def page(request):
    return render(request, "console/incidents.html", {})


urls = [path("incidents/", page, name="incident-list")]
urls.append(path("incidents/<int:pk>/", page, name="incident-detail"))
