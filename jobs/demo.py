"""A demo job's events in wire format v1: a job that crashes, rolls back and
shrinks, so a newcomer sees every category of the ledger with real numbers."""

import random

T0 = 1_790_000_000.0


def demo_events(job: str = "demo-llm", seed: int = 1, steps: int = 400) -> list[dict]:
    rng = random.Random(seed)
    events: list[dict] = []
    t = T0

    def emit(kind, attempt, node=None, rank=None, **data):
        e = {
            "id": f"{job}-{len(events) + 1:07d}",
            "job": job,
            "kind": kind,
            "ts": round(t, 6),
            "data": data,
        }
        if attempt is not None:
            e["attempt"] = attempt
        if node is not None:
            e["node"] = node
        if rank is not None:
            e["rank"] = rank
        events.append(e)

    # (nodes, first step, last step to run, how the launch ends, restore step)
    plan = [
        (["gpu-a00", "gpu-a01"], 1, int(steps * 0.34), ("crash", "gpu-a01", 79), None),
        (["gpu-a00", "gpu-a02"], None, int(steps * 0.55), ("loss_spike", None, None), "latest"),
        (["gpu-a00", "gpu-a02"], None, int(steps * 0.66), ("gpu_xid", "gpu-a00", 48), "older"),
        (["gpu-a02"], None, steps, None, "latest"),
    ]
    checkpoints: list[int] = []
    step = 0
    for attempt, (nodes, _, last, fault, restore) in enumerate(plan, start=1):
        world = 4 * len(nodes)
        emit("attempt_started", attempt, world_size=world, gpus_per_node=4, nodes=nodes)
        t += rng.uniform(20, 35)
        emit("ready", attempt)
        if restore:
            step = (
                checkpoints[-1] if restore == "latest" or len(checkpoints) < 2 else checkpoints[-2]
            )
            emit("checkpoint_load_started", attempt, step=step)
            t += rng.uniform(8, 12)
            emit("checkpoint_loaded", attempt, step=step)
        while step < last:
            step += 1
            dt = rng.gauss(1.0, 0.02) * (1.25 if attempt == 2 and step % 7 == 0 else 1.0)
            t += dt
            loss = 3.0 * (0.995**step) + rng.gauss(0, 0.01)
            emit("step", attempt, rank=0, step=step, loss=round(loss, 5), step_time_s=round(dt, 6))
            if step % 10 == 0:
                for rank in range(world):
                    node = nodes[rank // 4]
                    compute = 0.8 * dt * rng.uniform(0.98, 1.02)
                    emit(
                        "rank_window",
                        attempt,
                        node=node,
                        rank=rank,
                        first_step=step - 9,
                        last_step=step,
                        compute_s=round(compute, 6),
                        step_s=round(dt, 6),
                        comm_wait_s=round(dt - compute, 6),
                    )
                for node in nodes:
                    emit("heartbeat", None, node=node)
            if step % 50 == 0:
                emit("checkpoint_save_started", attempt, step=step)
                t += 4.0
                emit(
                    "checkpoint_saved",
                    attempt,
                    step=step,
                    blocking_s=4.0,
                    bytes=2_000_000_000,
                    uri=f"s3://ckpt/{job}/step-{step}",
                    tier="remote",
                )
                if step not in checkpoints:
                    checkpoints.append(step)
                checkpoints.sort()
        if fault is None:
            t += 5.0
            emit("attempt_ended", attempt, reason="completed")
            emit("job_finished", attempt)
            break
        kind, node, xid = fault
        t += rng.uniform(0.2, 0.8)
        data = {"type": kind}
        if xid:
            data["xid"] = xid
        emit("fault", attempt, node=node, **data)
        t += rng.uniform(5, 20)
        emit("attempt_ended", attempt, reason="failed" if kind != "loss_spike" else "killed")
        t += rng.uniform(15, 60)
    return events
