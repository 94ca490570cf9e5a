"""The training side of Rebound (no Django): `agent.init(ddp_model)` instruments a torch
job from its environment (agent.auto); `agent.checkpoint_requested()` tells the loop
that recovery asked for a checkpoint now (agent.checkpoint_request); the reporter, torch
hooks and the local cluster live in their modules."""


def init(model=None, **kwargs):
    """The zero-config Instrument of this process: `agent.auto.init` (imported on call, so
    that `import agent` costs nothing and needs no torch)."""
    from agent.auto import init as _init

    return _init(model, **kwargs)


def checkpoint_requested(control=None, *, agree: bool = False) -> bool:
    """True once per "checkpoint now" request (SIGUSR1, or a new id in the job's control
    file): `agent.checkpoint_request.checkpoint_requested` (stdlib only)."""
    from agent.checkpoint_request import checkpoint_requested as _requested

    return _requested(control, agree=agree)
