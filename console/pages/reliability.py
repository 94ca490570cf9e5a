"""Reliability report page (being built)."""

from django.shortcuts import render
from django.urls import path

from console.pages.common import viewer_page


@viewer_page
def page(request):
    return render(request, "console/reliability.html", {})


urls = [path("reliability/", page, name="reliability")]
