"""The recovery app's layering, read from its source: services and selectors never
import the tasks or the queue that sends them (a service records; its caller sends),
and no module of the app imports the `console` project."""

import ast
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[2] / "recovery"


def imported(path: Path) -> set[str]:
    """Every module `path` imports, at its top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def modules(*parts: str) -> list[Path]:
    return sorted(p for part in parts for p in (APP / part).rglob("*.py"))


@pytest.mark.parametrize("path", modules("services", "selectors"), ids=lambda p: p.stem)
def test_services_and_selectors_send_no_task(path):
    sending = {"recovery.tasks", "recovery.queue"}
    assert not imported(path) & sending, f"{path.relative_to(APP.parent)} imports what sends"


def test_the_app_imports_no_console():
    for path in sorted(APP.rglob("*.py")):
        found = {m for m in imported(path) if m == "console" or m.startswith("console.")}
        assert not found, f"{path.relative_to(APP.parent)} imports {found}"
