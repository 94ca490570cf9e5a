"""A short torch burn-in for `validate_node`: matmul throughput and a determinism
checksum (the same seeded computation twice must give the same bits, and finite
numbers). Run in a subprocess so a hung or crashing GPU takes only it down:

    python -m recovery.drivers.burnin --seconds 3 --size 1024 [--min-gflops 100]

Prints one JSON object. Exit code 0: passed; 1: failed; 3: torch is missing.
No Django here. The drivers build the command line with `command()` and read
the answer back with `result_from()`, so all three run and read it one way.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

EXIT_FAILED = 1
EXIT_NO_TORCH = 3
# The checkout `python -m recovery.drivers.burnin` must run from (local, single-host Slurm).
REPO = Path(__file__).resolve().parents[2]


def command(*, seconds: float, size: int, min_gflops: float, python: str = "python") -> list[str]:
    """The burn-in's command line, run with the interpreter `python`."""
    return [
        python,
        "-m",
        "recovery.drivers.burnin",
        "--seconds",
        f"{seconds:g}",
        "--size",
        str(size),
        "--min-gflops",
        f"{min_gflops:g}",
    ]


def result_from(output: str) -> dict | None:
    """The burn-in's answer in its output: the last line that is a JSON object
    (None when there is none)."""
    for line in reversed(output.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def burn_in(*, seconds: float, size: int, device: str | None = None) -> dict:
    import torch

    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    g = torch.Generator().manual_seed(1234)
    a = torch.randn(size, size, generator=g).to(dev)
    b = torch.randn(size, size, generator=g).to(dev)

    def checksum() -> tuple[str, bool]:
        c = a @ b
        for _ in range(4):
            c = torch.tanh(c @ b / size**0.5)
        sync()
        host = c.float().cpu()
        return hashlib.sha256(host.numpy().tobytes()).hexdigest(), bool(torch.isfinite(host).all())

    first, finite = checksum()
    iterations, began = 0, time.perf_counter()
    while True:
        for _ in range(4):
            a @ b
        sync()
        iterations += 4
        elapsed = time.perf_counter() - began
        if elapsed >= seconds:
            break
    second, finite_again = checksum()
    return {
        "device": dev if not dev.startswith("cuda") else torch.cuda.get_device_name(),
        "size": size,
        "iterations": iterations,
        "seconds": round(elapsed, 3),
        # Three significant digits: a small matrix on a busy CPU still reads above zero.
        "gflops": float(f"{2 * size**3 * iterations / elapsed / 1e9:.3g}"),
        "checksum": first,
        "deterministic": first == second,
        "finite": finite and finite_again,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m recovery.drivers.burnin")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--min-gflops", type=float, default=0.0)
    p.add_argument("--device", default=None)
    args = p.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print(json.dumps({"passed": False, "error": "torch is not installed"}))
        return EXIT_NO_TORCH
    result = burn_in(seconds=args.seconds, size=args.size, device=args.device)
    problems = []
    if not result["deterministic"]:
        problems.append("the same computation gave different results")
    if not result["finite"]:
        problems.append("non-finite numbers")
    if result["gflops"] < args.min_gflops:
        problems.append(f"{result['gflops']} GFLOP/s is below {args.min_gflops}")
    result["passed"] = not problems
    result["problems"] = problems
    print(json.dumps(result))
    return 0 if not problems else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
