"""The wire vocabulary is defined once (common.vocabulary), imports only the standard
library (the agent loads it in training processes), and every reader agrees with it."""

import ast
import sys
from pathlib import Path

from agent import control
from agent.reporter import _CLASS_OF, _LIFECYCLE
from common import vocabulary as v
from incidents.models import Incident
from jobs import wire
from jobs.models import Event

SOURCE = Path(v.__file__)


def test_imports_nothing_but_the_standard_library():
    tree = ast.parse(SOURCE.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports"
            imported.add(node.module.split(".")[0])
    assert imported, "the check found the imports"
    assert imported <= sys.stdlib_module_names, imported - sys.stdlib_module_names


def test_event_kind_is_the_vocabulary():
    assert tuple(Event.Kind.values) == v.EVENT_KINDS
    assert Event.Kind.STEP == "step" and Event.Kind.JOB_REOPENED == "job_reopened"
    assert Event.TIMELINE_KINDS == v.TIMELINE_KINDS
    assert Event.LAUNCH_KINDS == v.LAUNCH_KINDS


def test_the_wire_and_the_agent_read_the_same_sets():
    assert frozenset(v.WIRE_KINDS) == wire.KINDS
    assert wire.FAULT_TYPES is v.FAULT_TYPES and wire.END_REASONS is v.END_REASONS
    assert wire.JOB_KEY is v.JOB_KEY and control.SLUG is v.JOB_KEY
    # The reporter sheds exactly the sheddable kinds, in that order; the rest it keeps.
    assert tuple(_CLASS_OF) == v.SHEDDABLE_KINDS
    assert all(_CLASS_OF.get(k, _LIFECYCLE) == _LIFECYCLE for k in v.NEVER_SHED_KINDS)


def test_the_two_lifecycle_sets_differ_on_purpose():
    # The console's timeline has no steps (they have a table of their own) and holds
    # its own reopen; the agent never sheds steps and never sends a reopen.
    assert "step" in v.NEVER_SHED_KINDS and "step" not in v.TIMELINE_KINDS
    assert "job_reopened" in v.TIMELINE_KINDS and "job_reopened" not in v.NEVER_SHED_KINDS
    assert set(v.TIMELINE_KINDS) <= set(v.EVENT_KINDS)
    assert set(v.LAUNCH_KINDS) | set(v.CHECKPOINT_SAVE_KINDS) == set(v.TIMELINE_KINDS)


def test_fault_causes_name_incident_causes_and_severities():
    causes, severities = set(Incident.Cause.values), set(Incident.Severity.values)
    for fault_type, (cause, severity) in v.FAULT_CAUSES.items():
        assert cause in causes and severity in severities, fault_type
    # Every reported type has a cause but gpu_xid, whose Xid decides (incidents.xid).
    assert set(v.FAULT_TYPES) - set(v.FAULT_CAUSES) == {"gpu_xid"}
    assert set(v.FAULT_CAUSES) - set(v.FAULT_TYPES) == {v.DEAD_NODE}
