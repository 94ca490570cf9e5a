"""The marks the kubernetes driver leaves on the cluster: the labels and
annotations it writes, and the rule for what counts as ours (a value that
starts with "rebound:", the prefix of every action key)."""

from __future__ import annotations

PREFIX = "rebound.dev"
CORDONED_BY = f"{PREFIX}/cordoned-by"
CORDONED_AT = f"{PREFIX}/cordoned-at"
CORDONED_LABEL = f"{PREFIX}/cordoned"
RESTART_BY = f"{PREFIX}/restart-by"
RESTART_PODS = f"{PREFIX}/restart-pods"
RESTART_AT = f"{PREFIX}/restart-at"
SCALED_BY = f"{PREFIX}/scaled-by"
SCALED_FROM = f"{PREFIX}/scaled-from"
VALIDATED_LABEL = f"{PREFIX}/validated"
VALIDATED_BY = f"{PREFIX}/validated-by"
BURNIN_LABEL = f"{PREFIX}/burnin"
ACTION_ANNOTATION = f"{PREFIX}/action"
OURS = "rebound:"  # the prefix of every action key


def ours(value) -> bool:
    return isinstance(value, str) and value.startswith(OURS)
