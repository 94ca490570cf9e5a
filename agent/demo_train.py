"""A small real training job: a character-level transformer trained with DDP on CPU.

(One module on purpose: the demo job's whole script, model, data and loop, under 500 lines.)

Launched once per rank (by `agent.cluster`, or by hand), with torch's env://
variables RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and LOCAL_RANK):

    RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \\
        python -m agent.demo_train --job demo --attempt 1 --steps 200 \\
        --ckpt-dir var/ckpt/demo --events var/demo.jsonl

It reports what a real job would (through `agent.torch_hooks`): rank 0 the
launch (`attempt_started`, `ready`, `attempt_ended`), steps, checkpoint saves
and restores; every rank its `rank_window` means and heartbeats. It resumes
from the latest complete checkpoint in `--ckpt-dir` (or `--resume-step N`, a
rollback) and continues at the checkpoint's step + 1. The global batch stays
the same on any number of ranks: each rank accumulates gradients over
global / (world x micro) micro-batches, and step s trains on the same sequences
whatever the world size.

Faults are injected through `--control` (see `agent.control`), read every step:
a `slow` rank sleeps inside its compute section for (factor - 1) x its usual
compute time (before backward, so its peers wait for it in the all-reduce), a
corrupted loss is multiplied by NaN or a
factor before backward (a NaN spreads to every rank through the gradients).
A failed collective (a peer lost or hung past `--collective-timeout-s`) is
reported as a `fault` of type nccl_timeout and ends the process with exit
code 3, which the launcher reads as "lost a peer", not as a crash of its own.
Exit code 2: bad options, or a `--resume-step` with no complete checkpoint.

A "checkpoint now" request (recovery's checkpoint_job: a new id in the control file,
or SIGUSR1; agent.checkpoint_request) is honoured at the step it is seen: the step is
saved besides the cadence. Rank 0's request decides, shared through the step's loss
all-reduce, so that every rank saves the same step at no extra collective.

`--no-instrument` trains the very same loop without the agent, the baseline of
bench/agent.py's overhead figure: no reporter or file sink (events go nowhere),
no DDP comm hook, no step, window, lifecycle or heartbeat events; the loop's
`Instrument` is a null object that only keeps each step's wall time (what the
slow-rank injection and `--log-every` read). Either way rank 0 ends a completed
launch with one machine-readable line: the steps its loop ran, the loop's own
wall time (startup, restore and the wait for the last save excluded), the CPU
time the whole process (every thread) used meanwhile, and the median wall time
of one iteration of the loop (a step with its reporting and any save), and
what the agent itself cost (`Instrument.cost()`: its seconds on the training
thread, its threads' CPU seconds; zeros without it):

    TRAINED steps=300 seconds=4.861233 cpu=4.790112 median_step_s=0.015870 instrumented=1
        agent_main_s=0.021300 agent_threads_cpu_s=0.030100   (one line)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import sys
import time
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from agent.checkpoint_request import checkpoint_requested, install_signal_handler
from agent.control import JobControl, NodeFlags
from agent.sinks import NullSink, make_sink
from agent.torch_hooks import Checkpointer, Instrument, TrainState

EXIT_CONFIG = 2
EXIT_PEER_LOST = 3  # a collective failed: a peer died or hung

CORPUS = """\
Every large training job fails sooner or later. A node loses a GPU, a link flaps, a
process runs out of memory, a disk fills up, a kernel hangs in a collective and the
whole job waits for it. At a few thousand accelerators this is not an accident but a
daily event, and the question is not whether the job fails but how much work it loses
each time. The answer is in the checkpoints: how often they are written, how long the
training loop is blocked while they are, and how quickly a new launch finds the last
good one and restores it. The rest is in the time it takes to notice: a crash is loud,
a hang is silent, and a slow node is the quietest of all, because the job still makes
progress, only less of it. Goodput is the share of time that produced progress which
was kept. Everything else is badput: starting up, restoring, saving, waiting, redoing
steps that were thrown away, and the dead time between one launch and the next.
Measure each of them, and the one that costs the most is the one to fix first.
"""


NOISE = 0.1  # the share of characters swapped for a random one
COPIES = 64


def _corpus_tensor():
    """The corpus, many times over, with one character in ten swapped at random (the
    same for every rank): the swaps cannot be learnt, so the loss settles near their
    entropy instead of falling towards zero with a memorised text, where its noise
    would look like spikes."""
    chars = sorted(set(CORPUS))
    index = {c: i for i, c in enumerate(chars)}
    clean = torch.tensor([index[c] for c in CORPUS], dtype=torch.long).repeat(COPIES)
    g = torch.Generator().manual_seed(7)
    swap = torch.rand(len(clean), generator=g) < NOISE
    noise = torch.randint(len(chars), (len(clean),), generator=g)
    return torch.where(swap, noise, clean), len(chars)


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    """A GPT-style character model: token and position embeddings, pre-norm blocks."""

    def __init__(self, vocab: int, *, d_model=64, layers=2, heads=4, seq_len=32):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(seq_len, d_model))
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


class Batches:
    """Step s's global batch is fixed by (seed, s); a rank takes its share of it."""

    def __init__(self, data, *, global_batch, micro_batch, seq_len, seed, rank, accumulation):
        self.data = data
        self.global_batch = global_batch
        self.micro_batch = micro_batch
        self.seq_len = seq_len
        self.seed = seed
        self.rank = rank
        self.accumulation = accumulation

    def get(self, step: int, micro: int):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(
            0, len(self.data) - self.seq_len - 1, (self.global_batch,), generator=g
        )
        first = (self.rank * self.accumulation + micro) * self.micro_batch
        rows = starts[first : first + self.micro_batch]
        offsets = torch.arange(self.seq_len)
        x = self.data[rows[:, None] + offsets]
        y = self.data[rows[:, None] + offsets + 1]
        return x, y


class _UntimedStep:
    """`Instrument.step()` without the agent: the step's wall time, nothing reported."""

    _nothing = contextlib.nullcontext()

    def __init__(self, owner: NoInstrument, step: int):
        self.owner = owner
        self.step = step
        self._t0 = 0.0

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb):
        step_s = time.perf_counter() - self._t0
        self.owner.last = {"step": self.step, "step_s": step_s, "compute_s": step_s}
        return False

    def data_wait(self):
        return self._nothing

    def comm_wait(self):
        return self._nothing

    def report(self, **_):
        pass


class NoInstrument:
    """The part of `Instrument`'s interface the loop uses, doing nothing (--no-instrument):
    no comm hook, no events, no heartbeat thread."""

    def __init__(self):
        self.last: dict | None = None

    def step(self, step: int) -> _UntimedStep:
        return _UntimedStep(self, step)

    def attach(self, ddp_model, process_group=None):
        return None

    def attempt_started(self, **_):
        pass

    def ready(self):
        pass

    def attempt_ended(self, reason="completed", exit_code=None):
        pass

    def fault(self, type_, message=None, **data):
        pass

    def close(self):
        pass

    def cost(self) -> dict:
        return {"main_s": 0.0, "threads_cpu_s": 0.0}


def _is_collective_error(exc: BaseException) -> bool:
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc).lower()
    return any(
        s in text for s in ("gloo", "connection closed", "connection reset", "timed out", "timeout")
    )


def parse_args(argv=None):
    env = os.environ
    p = argparse.ArgumentParser(
        prog="python -m agent.demo_train", description=__doc__.split("\n")[0]
    )
    p.add_argument("--job", default=env.get("REBOUND_JOB", "demo"))
    p.add_argument("--attempt", type=int, default=int(env.get("REBOUND_ATTEMPT", "1")))
    p.add_argument("--node", default=env.get("REBOUND_NODE") or socket.gethostname())
    p.add_argument("--nodes", default=env.get("REBOUND_NODES", ""), help="comma-separated")
    p.add_argument("--gpus-per-node", type=int, default=None)
    p.add_argument("--launched-at", type=float, default=None, help="unix time of the launch")
    p.add_argument("--steps", type=int, default=100, help="train until this step")
    p.add_argument("--global-batch", type=int, default=8, help="sequences per step, all ranks")
    p.add_argument("--micro-batch", type=int, default=2, help="sequences per rank per pass")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--ckpt-dir", default=None, help="shared checkpoint directory")
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--sync-ckpt", action="store_true", help="blocking saves (default: async)")
    p.add_argument("--resume-step", type=int, default=None, help="restore this step (rollback)")
    p.add_argument("--no-resume", action="store_true", help="start from scratch")
    p.add_argument("--window", type=int, default=10, help="steps per rank_window")
    p.add_argument("--heartbeat-s", type=float, default=5.0, help="0: no rank heartbeats")
    p.add_argument("--events", default=env.get("REBOUND_EVENTS"), help="JSON-lines file sink")
    p.add_argument("--url", default=env.get("REBOUND_URL"), help="console to post to")
    p.add_argument("--control", default=None, help="the job's fault control file")
    p.add_argument("--node-flags", default=None, help="the node's flags file")
    p.add_argument("--collective-timeout-s", type=float, default=60.0)
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket size (its default)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--log-every", type=int, default=0, help="rank 0 prints every N steps")
    p.add_argument(
        "--no-instrument",
        action="store_true",
        help="train without the agent (no reporter, hooks or events): the overhead baseline",
    )
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    # A rerun of a step after a rollback rewrites its checkpoint, on purpose.
    warnings.filterwarnings("ignore", message="Detected an existing checkpoint")
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    torch.set_num_threads(args.threads)

    per_pass = world * args.micro_batch
    if args.global_batch % per_pass:
        print(
            f"--global-batch {args.global_batch} is not a multiple of world size {world}"
            f" x micro-batch {args.micro_batch}",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    accumulation = args.global_batch // per_pass

    install_signal_handler()  # SIGUSR1: a checkpoint request, not the end
    control = JobControl(args.control)
    flags = NodeFlags(args.node_flags)
    if args.no_instrument:
        sink, inst = NullSink(), NoInstrument()
    else:
        sink = make_sink(
            {"events": args.events, "url": args.url},
            job=args.job,
            node=args.node,
            rank=rank,
            attempt=args.attempt,
        )
        inst = Instrument(
            sink,
            rank=rank,
            node=args.node,
            attempt=args.attempt,
            window=args.window,
            heartbeat_s=args.heartbeat_s or None,
            heartbeat_muted=lambda: not flags.heartbeats(),
            measure_cost=True,  # the TRAINED line's agent cost (bench/agent.py)
        )
    nodes = [n for n in args.nodes.split(",") if n] or [args.node]
    inst.attempt_started(
        world_size=world,
        gpus_per_node=args.gpus_per_node or -(-world // len(nodes)),
        nodes=nodes,
        ts=args.launched_at,
    )
    try:
        return _train(args, inst, sink, control, rank, world, accumulation)
    except FileNotFoundError as exc:  # a named checkpoint that is not there
        print(exc, file=sys.stderr, flush=True)
        return EXIT_CONFIG
    except Exception as exc:
        if world > 1 and _is_collective_error(exc):
            message = f"rank {rank}: collective failed: {exc}"
            print(message, file=sys.stderr, flush=True)
            inst.fault("nccl_timeout", message)
            return EXIT_PEER_LOST
        raise
    finally:
        inst.close()
        sink.flush(timeout_s=10.0)
        sink.close(timeout_s=10.0)
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


def _train(args, inst, sink, control, rank, world, accumulation) -> int:
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=timedelta(seconds=args.collective_timeout_s)
    )
    data, vocab = _corpus_tensor()
    torch.manual_seed(args.seed)
    model = TinyLM(
        vocab, d_model=args.d_model, layers=args.layers, heads=args.heads, seq_len=args.seq_len
    )
    # The model has no buffers, so DDP's forward does no collective of its own.
    ddp = DDP(model, gradient_as_bucket_view=True, bucket_cap_mb=args.bucket_mb)
    inst.attach(ddp)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    state = {"train": TrainState(ddp, optimizer)}
    ckpt = (
        Checkpointer(
            args.ckpt_dir,
            sink,
            rank=rank,
            node=args.node,
            attempt=args.attempt,
            async_save=not args.sync_ckpt,
        )
        if args.ckpt_dir
        else None
    )
    dist.barrier()
    inst.ready()

    restored = None
    if ckpt is not None and not args.no_resume:
        restored = ckpt.load(state, step=args.resume_step)
    first = (restored or 0) + 1
    batches = Batches(
        data,
        global_batch=args.global_batch,
        micro_batch=args.micro_batch,
        seq_len=args.seq_len,
        seed=args.seed,
        rank=rank,
        accumulation=accumulation,
    )
    if rank == 0:
        print(
            f"{args.job} attempt {args.attempt}: world {world}, accumulation {accumulation},"
            f" steps {first}..{args.steps}" + (f", restored step {restored}" if restored else ""),
            flush=True,
        )
    last_saved = restored
    tokens = world * accumulation * args.micro_batch * args.seq_len
    own_compute = None  # this rank's usual compute time per step, without injected delay
    loop_t0, loop_cpu0 = time.perf_counter(), time.process_time()
    ends = []  # when each iteration ended (perf_counter), for the TRAINED line
    for step in range(first, args.steps + 1):
        slow = control.slow_factor(rank)
        loss_fault = control.loss_fault(step, rank)
        asked = checkpoint_requested(control)
        delay = (slow - 1.0) * own_compute / accumulation if slow > 1.0 and own_compute else 0.0
        with inst.step(step) as s:
            total = 0.0
            for micro in range(accumulation):
                with s.data_wait():
                    x, y = batches.get(step, micro)
                sync = micro == accumulation - 1
                with contextlib.nullcontext() if sync else ddp.no_sync():
                    logits = ddp(x)
                    loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
                    if loss_fault is not None:
                        loss = loss * loss_fault[1]
                    if delay:
                        # A slow rank: its compute takes `slow` times as long, and its peers
                        # wait for it in the gradient all-reduce that follows.
                        time.sleep(delay)
                    (loss / accumulation).backward()
                total += loss.item() / accumulation
            if world > 1:
                # The step's loss is the global batch's: the mean over ranks; rank 0's
                # checkpoint request rides along, so every rank saves the same step.
                mean = torch.tensor([total / world, asked and rank == 0], dtype=torch.float64)
                with s.comm_wait():
                    dist.all_reduce(mean)
                total, asked = mean[0].item(), mean[1].item() > 0
            grad_norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            s.report(loss=total, grad_norm=grad_norm, tokens=tokens)
        state["train"].step = step
        if step > first:  # the first step of a launch warms up: not a usual one
            own = max(0.0, inst.last["compute_s"] - delay * accumulation)
            own_compute = own if own_compute is None else 0.9 * own_compute + 0.1 * own
        if args.log_every and rank == 0 and step % args.log_every == 0:
            ms = inst.last["step_s"] * 1e3
            print(f"step {step} loss {total:.4f} {ms:.1f} ms", flush=True)
        if asked and rank == 0:
            print(f"checkpoint requested: saving step {step}", flush=True)
        if ckpt is not None and (step % args.ckpt_every == 0 or step == args.steps or asked):
            ckpt.save(step, state)
            last_saved = step
        ends.append(time.perf_counter())
    loop_s, loop_cpu = time.perf_counter() - loop_t0, time.process_time() - loop_cpu0
    agent = inst.cost()
    iterations = [b - a for a, b in zip([loop_t0, *ends], ends, strict=False)]
    if ckpt is not None:
        ckpt.close()
    if rank == 0:
        print(f"done at step {args.steps}; last checkpoint {last_saved}", flush=True)
        print(
            f"TRAINED steps={max(0, args.steps - first + 1)} seconds={loop_s:.6f}"
            f" cpu={loop_cpu:.6f} median_step_s={statistics.median(iterations or [0.0]):.6f}"
            f" instrumented={0 if args.no_instrument else 1}"
            f" agent_main_s={agent['main_s']:.6f} agent_threads_cpu_s={agent['threads_cpu_s']:.6f}",
            flush=True,
        )
    inst.attempt_ended("completed", exit_code=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
