"""The training side of Rebound (no Django): `agent.init(ddp_model)` instruments a torch
job from its environment (agent.auto); the reporter, torch hooks and the local cluster
live in their modules."""


def init(model=None, **kwargs):
    """The zero-config Instrument of this process: `agent.auto.init` (imported on call, so
    that `import agent` costs nothing and needs no torch)."""
    from agent.auto import init as _init

    return _init(model, **kwargs)
