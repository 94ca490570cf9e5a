"""Approval queue page (being built)."""

from django.shortcuts import render
from django.urls import path

from console.pages.common import viewer_page


@viewer_page
def page(request):
    return render(request, "console/approvals.html", {})


urls = [path("approvals/", page, name="approvals")]
