"""The errors the recovery services raise: `common.errors` classes, so they carry no
HTTP status (the API's handler, common.api, maps each class to one; the pages show
`detail` with the same status)."""

from common.errors import Conflict, Invalid, PermissionDenied


class Refused(Conflict):
    """The action's state refuses the request. `code` names why: invalid_state,
    conflict (changed meanwhile), lease, guardrail (named in `guardrail`; `expired` and
    `moved_on` also end the action, its new `state` given), stale (back in the
    approval queue), duplicate (a policy's proposal made already)."""


class OwnAction(PermissionDenied):
    """The requester may not approve their own action: another operator must."""

    code = "own_action"


class InvalidAction(Invalid):
    """A proposal that can never be accepted as written; `field` names what is wrong."""

    code = "invalid"


class FaultInvalid(Invalid):
    """A fault injection asked wrongly (an unknown fault, a parameter missing or out
    of range); `field` names it."""

    code = "fault_refused"


class FaultRefused(Conflict):
    """A fault the cluster cannot take (its driver cannot inject, or refused)."""

    code = "fault_refused"


class LaunchRefused(Conflict):
    """A new launch the gate refuses (`recovery.services.launches`); `code` names why:
    job_finished, cluster_paused, crash_loop; `job` and the facts of the refusal ride
    along (`finished_at`, `paused_by`/`paused_at`/`reason`, `incident`)."""

    code = "launch_refused"
