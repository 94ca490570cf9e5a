"""The reporter against a fake console: batching, retries, shedding, the spill, exit hooks."""

import itertools
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from agent.reporter import Reporter
from agent.transport import retry_after
from tests.agent.fakes import TOKEN, FakeConsole, wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def console():
    c = FakeConsole().start()
    yield c
    c.stop()


@pytest.fixture
def down(console):
    """A console that is down now (its port is known: `start()` brings it back)."""
    console.stop()
    return console


@pytest.fixture
def spill(tmp_path):
    return tmp_path / "spill" / "job.jsonl"


@pytest.fixture
def reporter(console, spill):
    """Make reporters with short timings; each is closed after the test."""
    made = []

    def make(**kw):
        opts = dict(
            url=console.url,
            token=TOKEN,
            job="j1",
            node="n0",
            rank=0,
            attempt=1,
            flush_interval_s=0.05,
            backoff_base_s=0.01,
            backoff_cap_s=0.05,
            timeout_s=1.0,
            spill_path=spill,
            handle_sigterm=False,
        )
        opts.update(kw)
        r = Reporter(**opts)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close(timeout_s=0.3)


def steps(r, first, last, **extra):
    return [r.emit("step", {"step": s, "loss": 1.0, **extra}) for s in range(first, last + 1)]


def spill_lines(spill):
    # The sender may hand the spill over (rename it to `.sending`) while this reads:
    # read the spill first and `.sending` second, so what moved is read from its new name.
    lines = []
    for path in (spill, Path(f"{spill}.sending")):
        try:
            text = path.read_text()
        except FileNotFoundError:
            continue
        lines += [json.loads(x) for x in text.splitlines() if x.strip()]
    return lines


def run_script(code, timeout=20):
    return subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            "-c",
            f"import sys; sys.path.insert(0, {str(ROOT)!r})\n" + code,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


# ---- shape -----------------------------------------------------------------------------------


def test_import_needs_only_the_standard_library():
    out = run_script(
        textwrap.dedent(
            """
            import agent.reporter
            top = {m.split(".")[0] for m in sys.modules} - {"agent", "common", "__main__"}
            print(sorted(top - sys.stdlib_module_names))
            print(sorted(m for m in sys.modules if m.split(".")[0] == "common"))
            """
        )
    )
    assert out.returncode == 0, out.stderr
    # Of the console's code, only the stdlib-only vocabulary comes along.
    assert out.stdout.split("\n")[:2] == ["[]", "['common', 'common.vocabulary']"]


def test_events_carry_only_the_fields_that_are_set(console, reporter):
    r = reporter(attempt=None, rank=None)
    hb = r.emit("heartbeat")
    fault = r.emit("fault", {"type": "oom"}, ts=1_790_000_000, node="n7", rank=3)
    step = r.emit("step", {"step": 1, "loss": math.nan, "grad_norm": math.inf}, attempt=2)
    mine = r.emit("ready", attempt=1, event_id="my-own-id")
    assert r.flush(5)
    got = console.stored
    assert set(got[hb]) == {"id", "job", "kind", "ts", "node"}
    assert abs(got[hb]["ts"] - time.time()) < 5
    assert got[fault] == {
        "id": fault,
        "job": "j1",
        "kind": "fault",
        "ts": 1_790_000_000.0,
        "node": "n7",
        "rank": 3,
        "data": {"type": "oom"},
    }
    assert got[step]["attempt"] == 2
    assert got[step]["data"] == {"step": 1, "loss": "NaN", "grad_norm": "Infinity"}
    assert "data" not in got[mine] and mine == "my-own-id"
    assert re.fullmatch(r"j1-0-n0-\d+-[0-9a-f]{6}-\d+", hb)
    assert len({hb, fault, step}) == 3


def test_malformed_events_raise_at_emit(reporter):
    r = reporter(attempt=None, node=None, rank=None)
    with pytest.raises(ValueError, match="unknown event kind"):
        r.emit("steps", {"step": 1})
    with pytest.raises(ValueError, match="needs an attempt"):
        r.emit("step", {"step": 1})
    with pytest.raises(ValueError, match="needs a node"):
        r.emit("heartbeat")
    with pytest.raises(ValueError, match="needs a rank"):
        r.emit("rank_window", {}, attempt=1)
    with pytest.raises(TypeError, match="data must be a dict"):
        r.emit("fault", [1, 2])
    with pytest.raises(TypeError, match="not JSON serialisable"):
        r.emit("fault", {"type": object()})


# ---- batching --------------------------------------------------------------------------------


def test_a_full_batch_goes_at_once_and_the_rest_waits_for_the_tick(console, reporter):
    r = reporter(batch_size=10, flush_interval_s=60)
    steps(r, 1, 25)
    assert wait_for(lambda: len(console.stored) == 20)
    time.sleep(0.2)
    assert [len(q.ids) for q in console.requests] == [10, 10]
    assert r.flush(5)
    assert [len(q.ids) for q in console.requests] == [10, 10, 5]
    assert r.stats["sent"] == 25 and r.stats["queued"] == 0


def test_a_partial_batch_goes_every_interval(console, reporter):
    r = reporter(batch_size=1000, flush_interval_s=0.1)
    steps(r, 1, 3)
    assert wait_for(lambda: len(console.stored) == 3, timeout=2)
    assert [len(q.ids) for q in console.requests] == [3]


def test_requests_keep_to_5000_events_and_5_mib(console, reporter):
    r = reporter(batch_size=10_000, max_queue=20_000, flush_interval_s=60)
    for _ in range(6000):
        r.emit("heartbeat")
    assert r.flush(10)
    assert sorted(len(q.ids) for q in console.requests) == [1000, 5000]

    console.requests.clear()
    message = "x" * 4000
    for _ in range(1400):  # ~5.8 MB of JSON
        r.emit("fault", {"type": "other", "message": message})
    assert r.flush(10)
    assert len(console.requests) >= 2
    assert all(q.body_bytes <= 5 * 1024 * 1024 for q in console.requests)
    assert sum(len(q.ids) for q in console.requests) == 1400


def test_bodies_above_a_few_kb_are_gzipped(console, reporter):
    r = reporter(batch_size=100, flush_interval_s=60)
    r.emit("ready")
    assert r.flush(5)
    steps(r, 1, 100)
    assert r.flush(5)
    small, big = console.requests
    assert not small.gzip
    assert big.gzip and big.raw_bytes < big.body_bytes / 2


def test_emit_from_many_threads(console, reporter):
    r = reporter(batch_size=200)

    def work(t):
        for i in range(1000):
            r.emit("step", {"step": t * 1000 + i})

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert r.flush(10)
    assert len(console.stored) == 8000
    assert sum(len(q.ids) for q in console.requests) == 8000  # each sent once
    assert r.stats["sent"] == 8000 and r.stats["duplicates"] == 0


# ---- retries ---------------------------------------------------------------------------------


def test_5xx_is_retried_with_growing_backoff_and_the_same_ids(console, reporter):
    console.script.extend([503, 502, 500])
    r = reporter(backoff_base_s=0.05, backoff_cap_s=1.0)
    ids = steps(r, 1, 3)
    assert r.flush(5)
    reqs = console.requests
    assert [q.status for q in reqs] == [503, 502, 500, 202]
    assert all(q.ids == ids for q in reqs)
    gaps = [b.at - a.at for a, b in itertools.pairwise(reqs)]
    assert gaps[2] > gaps[0]  # 0.1..0.2 s against 0.025..0.05 s
    assert r.stats["failures"] == 3 and r.stats["sent"] == 3
    assert r.stats["last_error"].startswith("500")


def test_backoff_has_jitter_and_a_cap(reporter):
    r = reporter(backoff_base_s=0.5, backoff_cap_s=30.0)
    assert 0.25 <= r._transport.backoff(0) <= 0.5
    late = [r._transport.backoff(20) for _ in range(50)]
    assert all(15 <= d <= 30 for d in late) and len(set(late)) > 1


def test_429_waits_as_long_as_retry_after_says(console, reporter):
    console.script.append((429, {"Retry-After": "1"}))
    r = reporter()
    r.emit("ready")
    assert r.flush(5)
    first, second = console.requests
    assert second.at - first.at >= 0.95


def test_a_timeout_is_retried_and_the_resend_is_a_duplicate(console, reporter):
    # The console stores the batch but its answer comes after the client gave up.
    console.script.append(("slow", 0.8))
    r = reporter(timeout_s=0.3)
    ids = steps(r, 1, 3)
    assert r.flush(5)
    assert len(console.stored) == 3
    assert [q.ids for q in console.requests] == [ids, ids]
    assert r.stats["duplicates"] == 3 and r.stats["sent"] == 0
    assert r.stats["failures"] == 1


def test_delivers_once_the_console_is_up_and_says_so_once(down, reporter, caplog):
    r = reporter()
    with caplog.at_level(logging.INFO, logger="rebound.agent"):
        ids = steps(r, 1, 5)
        assert wait_for(lambda: r.stats["failures"] >= 3)
        assert not r.flush(0.2)
        assert "Connection" in r.stats["last_error"]
        down.start()
        assert r.flush(5)
    assert list(down.stored) == ids
    said = [x.getMessage() for x in caplog.records if x.levelno >= logging.WARNING]
    assert len(said) == 2
    assert "cannot deliver" in said[0] and "takes events again" in said[1]


def test_retry_after_in_seconds_or_as_a_date():
    from email.utils import formatdate

    assert retry_after("3") == 3.0
    assert retry_after("100000") == 300.0  # bounded
    assert 5 <= retry_after(formatdate(time.time() + 10, usegmt=True)) <= 10
    assert retry_after("soon") is None and retry_after(None) is None


def test_a_wrong_url_is_refused_loudly_and_kept(console, reporter, spill, caplog):
    r = reporter(url=console.url + "/elsewhere/")
    with caplog.at_level(logging.ERROR, logger="rebound.agent"):
        ids = steps(r, 1, 2)
        assert wait_for(lambda: r.stats["failures"] >= 2)
    assert {e["id"] for e in spill_lines(spill)} == set(ids)
    assert "404" in caplog.text and console.stored == {}
    assert console.requests[0].ids == ids


def test_413_splits_the_batch(console, reporter):
    console.script.append(413)
    r = reporter()
    steps(r, 1, 10)
    assert r.flush(5)
    assert [len(q.ids) for q in console.requests] == [10, 5, 5]
    assert len(console.stored) == 10


# ---- invalid events --------------------------------------------------------------------------


def test_400_drops_the_named_events_and_resends_the_others(console, reporter, caplog):
    r = reporter()
    ids = [r.emit("step", {"step": s, "bad": s == 3}) for s in range(1, 6)]
    with caplog.at_level(logging.ERROR, logger="rebound.agent"):
        assert r.flush(5)
    assert list(console.stored) == ids[:2] + ids[3:]
    assert [len(q.ids) for q in console.requests] == [5, 4]
    assert r.stats["rejected"] == 1
    (record,) = [x for x in caplog.records if x.name == "rebound.agent"]
    assert ids[2] in record.getMessage() and "bad on purpose" in record.getMessage()


def test_400_without_an_index_finds_the_bad_event_by_halves(console, reporter):
    r = reporter()
    ids = [r.emit("step", {"step": s, "poison": s == 6}) for s in range(1, 9)]
    assert r.flush(5)
    assert sorted(console.stored) == sorted(ids[:5] + ids[6:])
    assert r.stats["rejected"] == 1


def test_401_keeps_the_events_in_the_spill_logs_once_and_resumes(console, reporter, spill, caplog):
    console.refuse_token = True
    r = reporter()
    with caplog.at_level(logging.ERROR, logger="rebound.agent"):
        ids = steps(r, 1, 6)
        r.emit("heartbeat")
        assert wait_for(lambda: r.stats["failures"] >= 4)
        assert r.stats["spilled"] >= 6
        assert {e["id"] for e in spill_lines(spill)} >= set(ids)
        assert not r.flush(0.1)
        console.refuse_token = False
        assert r.flush(5)
    refused = [x for x in caplog.records if "refused" in x.getMessage()]
    assert len(refused) == 1 and "401" in refused[0].getMessage()
    assert set(ids) <= set(console.stored)
    assert spill_lines(spill) == []


# ---- shedding and the spill -------------------------------------------------------------------


def test_a_full_queue_sheds_heartbeats_then_windows_and_keeps_lifecycle(down, reporter):
    r = reporter(max_queue=10, batch_size=100, flush_interval_s=60)

    def window(i):
        return r.emit("rank_window", {"first_step": i, "last_step": i, "compute_s": 1, "step_s": 1})

    life = [r.emit("step", {"step": i}) for i in range(1, 5)]
    windows = [window(i) for i in range(1, 4)]
    beats = [r.emit("heartbeat") for _ in range(3)]
    assert r.stats["queued"] == 10 and r.stats["shed"] == 0
    beats.append(r.emit("heartbeat"))  # sheds the oldest heartbeat
    windows.append(window(4))  # sheds a heartbeat
    life.append(r.emit("step", {"step": 5}))  # sheds a heartbeat
    life.append(r.emit("step", {"step": 6}))  # sheds the last heartbeat
    beats.append(r.emit("heartbeat"))  # no heartbeat to shed but itself
    life.append(r.emit("step", {"step": 7}))  # sheds the oldest window
    windows.append(window(5))  # sheds a window
    assert r.stats["shed"] == 7 and r.stats["queued"] == 10 and r.stats["spilled"] == 0

    down.start()
    assert r.flush(5)
    assert sorted(down.stored) == sorted(life + windows[2:])


def test_the_spill_takes_the_oldest_lifecycle_events_and_is_sent_first(console, reporter, spill):
    r = reporter(max_queue=20, batch_size=10)
    ids = steps(r, 0, 4)
    assert r.flush(5)
    console.stop()
    ids += steps(r, 5, 104)
    for _ in range(30):
        r.emit("heartbeat")
    stats = r.stats
    assert stats["spilled"] >= 60 and stats["shed"] >= 10
    on_disk = {e["id"] for e in spill_lines(spill)}
    assert len(on_disk) >= 60 and on_disk <= set(ids)
    console.start()
    assert r.flush(10)
    stepped = [console.stored[i]["data"]["step"] for i in console.order if i in set(ids)]
    assert stepped == list(range(105))  # every step once, oldest first
    assert not spill.exists() and not Path(f"{spill}.sending").exists()
    assert r.stats["spill_pending"] is False


def test_a_new_reporter_sends_the_spill_a_closed_one_left(down, reporter, spill):
    first = reporter(max_queue=10)
    ids = steps(first, 1, 30)
    first.emit("heartbeat")
    assert first.close(timeout_s=0.3) is False
    assert {e["id"] for e in spill_lines(spill)} == set(ids)

    down.start()
    second = reporter()
    assert second.flush(5)
    assert sorted(down.stored) == sorted(ids)
    assert second.stats["sent"] == 30


def test_the_spill_survives_the_process_exiting(down, spill, reporter):
    code = f"""
    from agent.reporter import Reporter
    r = Reporter({down.url!r}, {TOKEN!r}, "j1", attempt=1, rank=0, max_queue=5,
                 spill_path={str(spill)!r}, backoff_base_s=0.01, exit_timeout_s=0.3)
    ids = [r.emit("step", {{"step": s}}) for s in range(20)]
    print(",".join(ids))
    """  # no close: the atexit hook spills what is left
    out = run_script(textwrap.dedent(code))
    assert out.returncode == 0, out.stderr
    ids = out.stdout.strip().split(",")
    assert {e["id"] for e in spill_lines(spill)} == set(ids)

    down.start()
    assert reporter().flush(5)
    assert sorted(down.stored) == sorted(ids)


def test_a_torn_spill_line_is_skipped_and_the_spill_stays_usable(down, reporter, spill, caplog):
    def line(i):
        return json.dumps(
            {"id": f"old-{i}", "job": "j1", "kind": "ready", "ts": 1.79e9, "attempt": 1}
        )

    spill.parent.mkdir(parents=True)
    Path(f"{spill}.sending").write_text(line(0) + "\n")
    spill.write_text(line(1) + "\n" + line(2) + "\n" + line(3)[:25])  # the crash cut the last
    r = reporter(max_queue=2)
    new = steps(r, 1, 4)
    assert wait_for(lambda: r.stats["spilled"] >= 2)
    text = spill.read_text().splitlines()
    assert text[2] == line(3)[:25] and json.loads(text[3])["id"] in new  # appended on a fresh line

    down.start()
    with caplog.at_level(logging.WARNING, logger="rebound.agent"):
        assert r.flush(5)
    assert sorted(down.stored) == sorted(["old-0", "old-1", "old-2", *new])
    assert any("torn" in x.getMessage() for x in caplog.records)


def test_an_unwritable_spill_keeps_lifecycle_events_in_memory(down, reporter, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = reporter(max_queue=5, spill_path=blocker / "spill.jsonl")  # a file as a directory
    ids = steps(r, 1, 20)
    assert r.stats["queued"] == 20 and r.stats["spilled"] == 0
    down.start()
    assert r.flush(5)
    assert sorted(down.stored) == sorted(ids)


# ---- flush, close, never blocking ---------------------------------------------------------------


def test_flush_and_close(console, reporter, spill):
    r = reporter()
    assert r.flush(0.1)  # nothing emitted
    ids = steps(r, 1, 3)
    assert r.close(timeout_s=2) is True
    assert r.close() is True  # idempotent
    assert sorted(console.stored) == sorted(ids)

    late = r.emit("attempt_ended", {"reason": "completed"})
    r.emit("heartbeat")
    assert [e["id"] for e in spill_lines(spill)] == [late]  # kept for the next process
    assert r.stats["shed"] == 1
    assert r.flush(0.1) is False


def test_close_is_bounded_when_the_console_hangs(console, reporter, spill):
    console.script.append(("slow", 3))
    r = reporter(timeout_s=5)
    ids = steps(r, 1, 3)
    assert wait_for(lambda: len(console.requests) == 1)
    started = time.monotonic()
    assert r.close(timeout_s=0.5) is False
    assert time.monotonic() - started < 1.5
    assert {e["id"] for e in spill_lines(spill)} == set(ids)

    again = reporter()  # the next process: the resend is a duplicate
    assert again.flush(5)
    assert again.stats["duplicates"] == 3 and len(console.stored) == 3


def test_emit_never_blocks_while_the_console_is_down(down, reporter, spill):
    r = reporter(max_queue=50_000, batch_size=500, flush_interval_s=1.0)
    per_10k = []
    started = time.perf_counter()
    for block in range(10):
        t = time.perf_counter()
        for i in range(10_000):
            if i % 5 < 3:
                r.emit("step", {"step": block * 10_000 + i, "loss": 0.5})
            else:
                r.emit("heartbeat")
        per_10k.append(time.perf_counter() - t)
    total = time.perf_counter() - started
    assert total < 5, per_10k
    assert max(per_10k) < 1.5, per_10k
    stats = r.stats
    assert stats["shed"] > 0 and stats["spilled"] > 0
    # Every step is kept: in memory, in the sender's hands, or in the spill.
    assert stats["queued"] + stats["spilled"] >= 60_000


# ---- process hooks ---------------------------------------------------------------------------


def test_exit_flushes(console, spill):
    code = f"""
    from agent.reporter import Reporter
    r = Reporter({console.url!r}, {TOKEN!r}, "j1", attempt=1, flush_interval_s=60,
                 spill_path={str(spill)!r})
    print(",".join(r.emit("step", {{"step": s}}) for s in range(5)))
    """
    out = run_script(textwrap.dedent(code))
    assert out.returncode == 0, out.stderr
    assert sorted(console.stored) == sorted(out.stdout.strip().split(","))


def test_sigterm_flushes_then_terminates(console, spill):
    code = f"""
    import os, signal, time
    from agent.reporter import Reporter
    r = Reporter({console.url!r}, {TOKEN!r}, "j1", attempt=1, flush_interval_s=60,
                 spill_path={str(spill)!r})
    print(",".join(r.emit("step", {{"step": s}}) for s in range(5)), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
    print("survived")
    """
    out = run_script(textwrap.dedent(code))
    assert out.returncode == -signal.SIGTERM, out.stderr
    assert "survived" not in out.stdout
    assert sorted(console.stored) == sorted(out.stdout.strip().split(","))


def test_sigterm_handler_only_where_none_is_installed(console, spill):
    code = f"""
    import signal, threading
    from agent.process_hooks import _on_sigterm
    from agent.reporter import Reporter
    def make():
        Reporter({console.url!r}, {TOKEN!r}, "j1", spill_path={str(spill)!r}).close()
    def mine(*a): pass
    signal.signal(signal.SIGTERM, mine)
    make()
    print(signal.getsignal(signal.SIGTERM) is mine)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    t = threading.Thread(target=make)
    t.start(); t.join()
    print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
    make()
    print(signal.getsignal(signal.SIGTERM) is _on_sigterm)
    """
    out = run_script(textwrap.dedent(code))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "True"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_hang_on_emit(console, reporter):
    r = reporter()
    r.emit("ready")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            r.emit("step", {"step": 1})
            r.flush(0.1)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert r.flush(5) and len(console.stored) == 1
