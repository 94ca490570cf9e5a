"""What a test run of the browser tests leaves behind and says: screenshots outside the
checkout unless asked for, and a loud line at the end of a run without Chromium."""

import os
import subprocess
import sys

import pytest

from tests.browser import conftest as browser
from tests.processes import ROOT

pytestmark = pytest.mark.engine_free

PNG = b"\x89PNG\r\n\x1a\n" + bytes(20_000)


def test_screenshots_go_to_docs_img_only_when_asked(monkeypatch, tmp_path):
    monkeypatch.setattr(browser, "SHOTS", tmp_path / "docs-img")
    monkeypatch.delenv("REBOUND_SCREENSHOTS", raising=False)
    path = browser.save_shot("overview.png", PNG)
    assert not path.is_relative_to(ROOT) and path.read_bytes() == PNG
    assert not (tmp_path / "docs-img").exists()

    monkeypatch.setenv("REBOUND_SCREENSHOTS", "1")
    assert browser.save_shot("overview.png", PNG) == tmp_path / "docs-img" / "overview.png"


def _run_browser_tests(tmp_path, **env):
    """The node-grid browser test in a pytest of its own, on SQLite, with no Chromium."""
    child_env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    child_env.update(REBOUND_VAR_DIR=str(tmp_path), REBOUND_CHROMIUM=str(tmp_path / "none"))
    child_env.pop("REBOUND_REQUIRE_BROWSER", None)
    child_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-k", "node_grid"]
        + ["tests/browser/test_console_browser.py"],
        cwd=ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_run_without_chromium_says_so_at_its_end_and_fails_when_the_browser_is_required(
    tmp_path,
):
    run = _run_browser_tests(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    tail = run.stdout[run.stdout.rindex("browser tests did not run") :]
    assert "apt-get install chromium" in tail, run.stdout
    assert "REBOUND_REQUIRE_BROWSER" in tail

    required = _run_browser_tests(tmp_path, REBOUND_REQUIRE_BROWSER="1")
    assert required.returncode != 0, required.stdout
    assert "REBOUND_REQUIRE_BROWSER is set, but no Chromium" in required.stdout
