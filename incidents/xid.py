"""NVIDIA Xid codes and what they say about the fault.

Classes: `hardware` (the GPU or its memory, links or board is at fault: take
the node out), `application` (most likely the program: restart it), `unknown`.
Extend or override with the REBOUND_XID_CLASSES setting, {xid: class}.
"""

from django.conf import settings

HARDWARE = "hardware"
APPLICATION = "application"
UNKNOWN = "unknown"

XID_CLASSES: dict[int, str] = {
    13: APPLICATION,  # graphics engine exception (often an out-of-range access)
    31: APPLICATION,  # GPU memory page fault
    43: APPLICATION,  # GPU stopped processing (the application's channel)
    45: APPLICATION,  # preemptive cleanup after a stopped or killed process
    48: HARDWARE,  # double-bit ECC error
    56: HARDWARE,  # display engine error
    57: HARDWARE,  # error programming video memory interface
    58: HARDWARE,  # unstable video memory interface
    61: HARDWARE,  # internal micro-controller breakpoint
    62: HARDWARE,  # internal micro-controller halt
    63: HARDWARE,  # ECC page retirement or row remap recorded
    64: HARDWARE,  # ECC page retirement or row remap failure
    68: HARDWARE,  # video processor exception
    69: HARDWARE,  # graphics engine class error
    73: HARDWARE,  # NVENC error
    74: HARDWARE,  # NVLink error
    79: HARDWARE,  # GPU has fallen off the bus
    80: HARDWARE,  # corrupted data sent to the GPU
    81: HARDWARE,  # VGA subsystem error
    92: HARDWARE,  # high single-bit ECC error rate
    94: HARDWARE,  # contained ECC error
    95: HARDWARE,  # uncontained ECC error
    119: HARDWARE,  # GSP RPC timeout
    120: HARDWARE,  # GSP error
    123: HARDWARE,  # SPI PMU RPC failure
}


def xid_class(xid: int | None) -> str:
    if xid is None:
        return UNKNOWN
    extra = getattr(settings, "REBOUND_XID_CLASSES", {}) or {}
    return extra.get(xid) or extra.get(str(xid)) or XID_CLASSES.get(xid, UNKNOWN)
