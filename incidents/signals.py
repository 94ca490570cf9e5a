"""What the incidents app announces, for the apps to its right (recovery) to react to.

Each is sent after the change is committed, with `sender=Incident` and
`incident=<Incident>`:

- `incident_opened`: a new incident (one fault episode) was opened;
- `incident_updated`: its cause, nodes, evidence or figures changed (its
  recovery included: the receiver sees its state);
- `incident_resolved`: it was closed (incidents.services.incident_resolve).

`incidents` never imports `recovery` or `notify`; they subscribe to these.
"""

from django.dispatch import Signal

incident_opened = Signal()
incident_updated = Signal()
incident_resolved = Signal()
