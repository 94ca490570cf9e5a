"""Template filters of the console pages."""

from django import template

from console.charts import gpu_hours as _gpu_hours

register = template.Library()


@register.filter
def gpu_hours(value) -> str:
    """GPU-hours (not seconds) as pages show them: three significant digits."""
    if value is None or value == "":
        return "\u2013"  # an en dash: no figure
    return _gpu_hours(float(value))
