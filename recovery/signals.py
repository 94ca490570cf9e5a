"""What the recovery app announces, for the apps to its right (notify) to react to.

- `action_changed`: an action moved (`recovery.services.actions.action_transition`)
  or was held where it stands (`blocked_by` set without a move: from == to). Sent
  after the change is committed, with `sender=Action`, `action=<Action>` as the move
  left it, `from_state`, `to_state` and `why`.

`recovery` never imports `notify`; notify subscribes to this.
"""

from django.dispatch import Signal

action_changed = Signal()
