"""Links to a job's or a node's page that never break a page: a stored name no URL
can carry (empty, or a cluster name with '/') shows as text instead."""

from django import template
from django.urls import NoReverseMatch, reverse
from django.utils.html import conditional_escape, format_html

register = template.Library()


def _link(view: str, args: list, text) -> str:
    try:
        url = reverse(view, args=args)
    except NoReverseMatch:
        return conditional_escape(text)
    return format_html('<a href="{}">{}</a>', url, text)


@register.simple_tag
def job_link(key):
    """`key` linked to its job's page."""
    return _link("console:job-detail", [key], key)


@register.simple_tag
def node_link(cluster, name):
    """`name` linked to the page of the node of that name in `cluster` (a name)."""
    return _link("console:node-detail", [cluster, name], name)
