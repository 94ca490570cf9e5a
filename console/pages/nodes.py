"""Nodes page (being built)."""

from django.shortcuts import render
from django.urls import path

from console.pages.common import viewer_page


@viewer_page
def page(request):
    return render(request, "console/nodes.html", {})


urls = [path("nodes/", page, name="node-list")]
urls.append(path("nodes/<str:cluster>/<str:name>/", page, name="node-detail"))
