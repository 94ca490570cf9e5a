"""Browser tests: real headless Chromium (Debian's /usr/bin/chromium driven by
Playwright; no browser is downloaded) against a real gunicorn serving the test
database, with a real Celery worker carrying out what the console queues.

Without Chromium or Playwright these tests skip, and the run's summary says so at its
end; with REBOUND_REQUIRE_BROWSER=1 (CI sets it) they fail instead.

Screenshots go to a temporary directory; with REBOUND_SCREENSHOTS=1 they refresh the
README's pictures under docs/img/ (a test run otherwise leaves the checkout as it was).

Each tab records what would be a defect whatever the page: a script error, a page
or static file that did not load, a request to anywhere but the console itself.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from django.conf import settings

from tests.factories import UserFactory
from tests.processes import ROOT, Server, celery_worker

CHROMIUM = Path(os.environ.get("REBOUND_CHROMIUM", "/usr/bin/chromium"))
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
VIEWPORT = {"width": 1440, "height": 900}
SHOTS = ROOT / "docs" / "img"
PASSWORD = "correct-horse-battery-staple-42"
WAIT_MS = 15_000
ASYNC_UNSAFE = "DJANGO_ALLOW_ASYNC_UNSAFE"
INSTALL_HINT = "install it (Debian: apt-get install chromium), or set REBOUND_CHROMIUM"
# Why the browser tests skipped in this run, for the summary at its end.
skipped_because: set[str] = set()


def missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not CHROMIUM.exists():
        return f"no Chromium at {CHROMIUM}: {INSTALL_HINT}"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed (pip install -e '.[test]')"
    return None


@pytest.fixture(scope="module")
def chromium():
    """The browser, for one module: Playwright's sync API keeps an event loop running
    in this thread meanwhile, and Django refuses ORM calls while one runs. These tests
    are synchronous code, so that check is lifted here, and only meanwhile."""
    why = missing()
    if why:
        if os.environ.get("REBOUND_REQUIRE_BROWSER") == "1":
            pytest.fail(f"REBOUND_REQUIRE_BROWSER is set, but {why}")
        skipped_because.add(why)
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    before = os.environ.get(ASYNC_UNSAFE)
    os.environ[ASYNC_UNSAFE] = "true"
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            yield browser
            browser.close()
    finally:
        if before is None:
            os.environ.pop(ASYNC_UNSAFE, None)
        else:
            os.environ[ASYNC_UNSAFE] = before


@pytest.fixture(scope="module")
def console(chromium, django_db_setup, django_db_blocker):
    """gunicorn on the test database and a Celery worker on the queue it sends to.
    They share this process's VAR_DIR, so that on SQLite the worker reads the
    filesystem broker the server writes to."""
    with celery_worker() as worker:
        server = Server(Path(settings.VAR_DIR))
        server.start()
        server.worker = worker
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def accounts(transactional_db):
    """Users who sign in through the form: two operators and a viewer."""

    return {
        "alice": UserFactory(username="alice", password=PASSWORD, role="operator"),
        "bob": UserFactory(username="bob", password=PASSWORD, role="operator"),
        "vera": UserFactory(username="vera", password=PASSWORD, role="viewer"),
    }


class Tab:
    """One signed-in browser context and its page, with the defects it saw."""

    def __init__(self, browser, base_url: str):
        self.base = base_url
        self.context = browser.new_context(viewport=VIEWPORT, base_url=base_url)
        self.context.set_default_timeout(WAIT_MS)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.foreign: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(f"script error: {exc}"))
        self.page.on("request", self._request)
        self.page.on("response", self._response)

    def _request(self, request):
        if not request.url.startswith((self.base, "data:", "blob:", "about:")):
            self.foreign.append(request.url)

    def _response(self, response):
        # A refused decision answers 4xx by design; a page or a file must not.
        if response.request.method == "GET" and response.status >= 400:
            self.errors.append(f"{response.status} {response.url}")

    def login(self, username: str, next_url: str = "/") -> None:
        page = self.page
        page.goto(next_url)
        assert "/login/" in page.url, page.url  # strangers are sent to sign in first
        page.fill("#id_username", username)
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(lambda url: "/login/" not in url)

    def assert_clean(self) -> None:
        assert self.errors == [], self.errors
        assert self.foreign == [], f"requests outside the console: {self.foreign}"

    def screenshot(self) -> bytes:
        return self.page.screenshot(full_page=False)

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def tabs(chromium, console):
    """`tabs()` opens a fresh browser context on the console; all closed at the end."""
    opened: list[Tab] = []

    def open_tab() -> Tab:
        tab = Tab(chromium, console.url)
        opened.append(tab)
        return tab

    yield open_tab
    for tab in opened:
        tab.close()


def shots_dir() -> Path:
    """docs/img/ when asked (REBOUND_SCREENSHOTS=1), else a directory outside the checkout."""
    if os.environ.get("REBOUND_SCREENSHOTS") == "1":
        return SHOTS
    return Path(tempfile.gettempdir()) / f"rebound-screenshots-{os.getuid()}"


def save_shot(name: str, png: bytes) -> Path:
    """Written only by a test that passed: call it last. Returns where it went."""
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000, "not a picture"
    path = shots_dir() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png)
    return path


def pytest_terminal_summary(terminalreporter):
    """A run without the browser says so at its end, loudly: one `s` among hundreds of
    dots is easy to miss."""
    if not skipped_because:
        return
    skipped = [
        r
        for r in terminalreporter.stats.get("skipped", [])
        if r.nodeid.startswith("tests/browser/")
    ]
    tr = terminalreporter
    tr.write_sep("!", f"browser tests did not run ({len(skipped)} skipped)", red=True, bold=True)
    for why in sorted(skipped_because):
        tr.write_line(f"  {why}", yellow=True, bold=True)
    tr.write_line("  (REBOUND_REQUIRE_BROWSER=1 makes them fail instead of skipping, as CI does)")
