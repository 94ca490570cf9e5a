"""The code's shape, as the contract (docs/architecture.md) states it, checked on the
source: which app may import which, services that never import tasks, selectors that
never write, and modules short enough to read (or saying why not)."""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APPS = ["common", "jobs", "incidents", "recovery", "notify", "agent"]
# Left to right, the way data flows: an app imports only apps to its left.
FLOW = ["common", "jobs", "incidents", "recovery", "notify"]
# The one crossing of the flow: the local driver drives the agent's local cluster of
# torch processes, as the Slurm driver drives slurmctld (through its public API only).
DRIVES_THE_LOCAL_CLUSTER = {"recovery/drivers/local.py": {"agent"}}
MAX_LINES = 500
# A module over MAX_LINES says why in its first lines, after this marker.
LONG_MARKER = "Long module:"
# Calls that write the database or the cache.
WRITES = {
    "create",
    "bulk_create",
    "bulk_update",
    "get_or_create",
    "update_or_create",
    "update",
    "delete",
    "save",
    "set",
    "set_many",
    "delete_many",
    "incr",
}


def modules(*packages):
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def top(name: str) -> str:
    return name.split(".")[0]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_no_app_imports_the_console_project():
    found = [
        f"{rel(p)} imports {n}" for p in modules(*APPS) for n in imported(p) if top(n) == "console"
    ]
    assert not found, found


@pytest.mark.parametrize("app", FLOW)
def test_an_app_imports_only_apps_to_its_left(app):
    right = set(FLOW[FLOW.index(app) + 1 :]) | {"agent"}
    found = [
        f"{rel(p)} imports {n}"
        for p in modules(app)
        for n in imported(p)
        if top(n) in right and top(n) not in DRIVES_THE_LOCAL_CLUSTER.get(rel(p), ())
    ]
    assert not found, found


def test_the_agent_imports_no_app_but_the_shared_vocabulary():
    """It runs beside torch code on training nodes, without Django or a database."""
    found = [
        f"{rel(p)} imports {n}"
        for p in modules("agent")
        for n in imported(p)
        if top(n) in {"django", "rest_framework", "celery", "console", *FLOW}
        and n not in {"common", "common.vocabulary"}
        and not n.startswith("common.vocabulary.")
    ]
    assert not found, found


def test_the_shared_layer_imports_no_app():
    found = [
        f"{rel(p)} imports {n}"
        for p in modules("common")
        for n in imported(p)
        if top(n) in set(APPS) - {"common"} | {"console"}
    ]
    assert not found, found


def test_the_wire_vocabulary_is_stdlib_only():
    path = ROOT / "common" / "vocabulary.py"
    outside = [n for n in imported(path) if top(n) not in sys.stdlib_module_names]
    assert not outside, outside


def _is_services(path: Path) -> bool:
    return path.stem == "services" or path.parent.name == "services"


def _is_selectors(path: Path) -> bool:
    return path.stem == "selectors" or path.parent.name == "selectors"


def test_services_and_selectors_send_no_task():
    """A service records and a selector reads; the caller sends the task after commit
    (through the app's tasks or its one queue module)."""
    sending = {"tasks", "queue"}
    found = [
        f"{rel(p)} imports {n}"
        for p in modules("common", "jobs", "incidents", "recovery")
        if _is_services(p) or _is_selectors(p)
        for n in imported(p)
        if sending & set(n.split(".")[1:2])
    ]
    assert not found, found


def writes_in(path: Path) -> list[str]:
    """The calls in `path` that write the database or the cache."""
    return [
        f"{rel(path)}:{node.lineno} .{node.func.attr}()"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in WRITES
        # dict.update or set.update of a local is no write: only calls on a
        # manager, a queryset, a related set or the cache count
        and _writes_storage(node.func.value)
    ]


def test_selectors_never_write():
    found = [
        w
        for p in modules("jobs", "incidents", "recovery")
        if _is_selectors(p)
        for w in writes_in(p)
    ]
    assert not found, found


def test_the_write_check_sees_writes_and_passes_reads(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    module = tmp_path / "selectors.py"
    module.write_text(
        "def f(job, rows, seen):\n"
        "    seen.update(rows)\n"  # a local set: no write
        "    Job.objects.filter(pk=job.pk).update(x=1)\n"
        "    Job.objects.create(key='k')\n"
        "    job.attempts_set.all()\n"
        "    cache.set('k', 1)\n"
        "    return Job.objects.filter(pk=job.pk).first()\n"
    )
    assert [w.split(" ")[1] for w in writes_in(module)] == [".update()", ".create()", ".set()"]


def _writes_storage(target: ast.AST) -> bool:
    text = ast.unparse(target)
    return (
        "objects" in text
        or text == "cache"
        or text.endswith("_set")
        or isinstance(target, ast.Call)  # a queryset built in place: .filter(...).update()
    )


def test_modules_are_short_or_say_why():
    found = []
    for path in modules(*APPS, "console", "bench"):
        lines = path.read_text().splitlines()
        if len(lines) > MAX_LINES and not any(LONG_MARKER in line for line in lines[:30]):
            found.append(f"{rel(path)}: {len(lines)} lines")
    assert not found, found
