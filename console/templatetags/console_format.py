"""Template filters of the console pages."""

from decimal import ROUND_HALF_UP, Decimal

from django import template

from console.charts import byte_size as _byte_size
from console.charts import gpu_hours as _gpu_hours
from console.charts import significant as _significant

register = template.Library()


@register.filter
def gpu_hours(value) -> str:
    """GPU-hours (not seconds) as pages show them: three significant digits."""
    if value is None or value == "":
        return "\u2013"  # an en dash: no figure
    return _gpu_hours(float(value))


@register.filter
def significant(value, digits=3) -> str:
    """A number with `digits` significant digits and no exponent (console.charts)."""
    if value is None or value == "":
        return "\u2013"
    return _significant(float(value), int(digits))


@register.filter
def byte_size(value) -> str:
    """Bytes in the unit that fits: 48.2 MB, 1.53 TB."""
    if value is None or value == "":
        return "\u2013"
    return _byte_size(float(value))


# Currencies written with their sign before the amount; others get their code after it.
CURRENCY_SIGNS = {"USD": "$"}


def _amount(value: Decimal) -> str:
    """Whole units with thousands separators; cents below 100 (where they matter)."""
    unit = Decimal("0.01") if abs(value) < 100 else Decimal(1)
    return f"{value.quantize(unit, rounding=ROUND_HALF_UP):,}"


@register.filter
def money(value) -> str:
    """Money for people: "$1,234", "1,234 EUR"; several currencies joined with " + "
    (a dict {currency: amount}, the reliability report's); none: an en dash."""
    if not value:
        return "\u2013"
    if isinstance(value, dict):
        return " + ".join(money((amount, currency)) for currency, amount in value.items())
    amount, currency = value
    sign = CURRENCY_SIGNS.get(currency)
    text = _amount(Decimal(amount))
    return f"{sign}{text}" if sign else f"{text} {currency}"
