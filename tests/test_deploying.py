"""README "Deploying", followed as written: its marked block run as it stands, with
deploy/rebound.env filled in for this machine (the test database, through a PgBouncer
in transaction mode where there is one, free ports, a var folder of its own), up to
the console answering as it will behind the proxy. Then the same behind a real nginx
with deploy/nginx/rebound.conf (TLS, the proxy headers, static files), where nginx is
installed."""

import os
import re
import secrets
import subprocess
import time
import warnings
from pathlib import Path

import pytest
import requests
from django.db import connection

from tests.processes import (
    ROOT,
    PgBouncer,
    _stop,
    database_url,
    free_port,
    need_program,
    queue_prefix,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),  # its processes read the test database
    pytest.mark.timeout(300),
    pytest.mark.engine_free,  # the deployment runs on PostgreSQL: CI's first pass has it
]

MARKER = "<!-- tests/test_deploying.py runs the next block -->"
DEPLOY = ROOT / "deploy"
HOST = "rebound.test"


def readme_block() -> str:
    """The shell block after the marker in README's "Deploying"."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Deploying\n", 1)[1].split("\n## ", 1)[0]
    assert MARKER in section, "the marked block is gone from README's Deploying section"
    after = section.split(MARKER, 1)[1]
    match = re.match(r"\s*```sh\n(.*?)\n```", after, re.S)
    assert match, "no ```sh block right after the marker"
    return match.group(1)


def env_file(path: Path, values: dict[str, str]) -> Path:
    """deploy/rebound.env with `values` in place of its own: every key this test sets
    is one the file has, so the file and the README stay what this test runs."""
    text = (DEPLOY / "rebound.env").read_text()
    for key, value in values.items():
        text, n = re.subn(rf"^{key}=.*$", f"{key}={value}", text, flags=re.M)
        assert n == 1, f"deploy/rebound.env has no {key}= line"
    path.write_text(text)
    return path


def load_env(path: Path) -> dict[str, str]:
    lines = (line.split("=", 1) for line in path.read_text().splitlines())
    return {kv[0]: kv[1] for kv in lines if len(kv) == 2 and not kv[0].startswith("#")}


@pytest.fixture
def deployed(tmp_path):
    """The filled-in environment file (through a PgBouncer on PostgreSQL when there is
    one), and the process environment that loads it: none of this run's own settings."""
    bouncer = None
    db_url, pooler = database_url(), ""
    if connection.vendor == "postgresql" and PgBouncer.available:
        bouncer = PgBouncer(tmp_path / "pgbouncer")
        bouncer.start()
        db_url, pooler = bouncer.url, "transaction"
    values = {
        "REBOUND_SECRET_KEY": secrets.token_urlsafe(48),
        "REBOUND_ALLOWED_HOSTS": HOST,
        "REBOUND_CSRF_TRUSTED_ORIGINS": f"https://{HOST}",
        "REBOUND_VAR_DIR": str(tmp_path / "var"),
        "DATABASE_URL": db_url,
        "REBOUND_DB_POOLER": pooler,
        "REDIS_URL": os.environ.get("REDIS_URL", ""),
        "REBOUND_CELERY_QUEUE": queue_prefix(),
        "REBOUND_WEB_BIND": f"127.0.0.1:{free_port()}",
        "REBOUND_WEB_WORKERS": "1",
    }
    path = env_file(tmp_path / "rebound.env", values)
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["REBOUND_ENV_FILE"] = str(path)
    try:
        yield path, env
    finally:
        if bouncer is not None:
            bouncer.stop()


def test_the_readme_deploying_block_serves_a_page_behind_the_proxy_header(deployed, tmp_path):
    need_program("curl", "apt-get install curl")
    path, env = deployed
    block = readme_block()
    r = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "200", r.stdout[-3000:] + r.stderr[-3000:]
    settings = load_env(path)
    assert (Path(settings["REBOUND_VAR_DIR"]) / "staticfiles" / "staticfiles.json").exists()
    pid = int((Path(settings["REBOUND_VAR_DIR"]) / "web.pid").read_text())
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)  # the block's `kill` stops it, as systemd would
    assert not Path(f"/proc/{pid}").exists(), "the block left gunicorn running"


NGINX_CONF = """
{user}
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log;
events {{ worker_connections 64; }}
http {{
    include /etc/nginx/mime.types;
    access_log {dir}/access.log;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    include {dir}/rebound.conf;
}}
"""


def nginx_site(var_dir: str, bind: str, certs: Path, http_port: int, https_port: int) -> str:
    """deploy/nginx/rebound.conf with this machine's paths, ports and host name."""
    site = (DEPLOY / "nginx" / "rebound.conf").read_text()
    for old, new in [
        ("listen [::]:80;", ""),
        ("listen [::]:443 ssl http2;", ""),
        ("listen 80;", f"listen 127.0.0.1:{http_port};"),
        ("listen 443 ssl http2;", f"listen 127.0.0.1:{https_port} ssl http2;"),
        ("/etc/ssl/rebound/", f"{certs}/"),
        ("/var/lib/rebound/", f"{var_dir}/"),
        ("127.0.0.1:8000", bind),
        ("rebound.example.com", HOST),
    ]:
        assert old in site, f"deploy/nginx/rebound.conf no longer has {old!r}"
        site = site.replace(old, new)
    return site


def test_behind_nginx_the_console_answers_over_tls_and_nginx_serves_the_static_files(
    deployed, tmp_path
):
    need_program("nginx", "apt-get install nginx-light")
    path, env = deployed
    block = readme_block()
    # The block up to the check (migrate, collectstatic, check --deploy); the server
    # as its unit starts it.
    setup = block.split("\n.venv/bin/gunicorn", 1)[0]
    r = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", setup], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    settings = load_env(path)
    unit = (DEPLOY / "systemd" / "rebound-web.service").read_text()
    exec_start = re.search(r"^ExecStart=/opt/rebound/(.*)$", unit, re.M).group(1).split()
    web = subprocess.Popen(
        exec_start,
        cwd=ROOT,
        env={**env, **settings},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    nginx_dir = tmp_path / "nginx"
    nginx_dir.mkdir()
    certs = tmp_path / "certs"
    certs.mkdir()
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-subj", f"/CN={HOST}", "-keyout", str(certs / "privkey.pem")]
        + ["-out", str(certs / "fullchain.pem")],
        check=True,
        capture_output=True,
    )
    http_port, https_port = free_port(), free_port()
    (nginx_dir / "rebound.conf").write_text(
        nginx_site(
            settings["REBOUND_VAR_DIR"], settings["REBOUND_WEB_BIND"], certs, http_port, https_port
        )
    )
    # Root's nginx would run its workers as nobody, who may not read pytest's folders.
    user = "user root;" if os.geteuid() == 0 else ""
    (nginx_dir / "nginx.conf").write_text(NGINX_CONF.format(user=user, dir=nginx_dir))
    nginx = subprocess.Popen(
        ["nginx", "-p", str(nginx_dir), "-c", str(nginx_dir / "nginx.conf")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    https = f"https://127.0.0.1:{https_port}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a self-signed certificate
            page = until_answers(lambda: get(https + "/login/"), web, nginx)
            assert page.status_code == 200, page.text[:2000]
            # Django saw HTTPS (the header nginx set): HSTS, a secure CSRF cookie.
            assert "max-age=" in page.headers["Strict-Transport-Security"]
            assert "Secure" in page.headers["Set-Cookie"]
            # A static file the page links, hashed, served by nginx (gunicorn never sees it).
            css = re.search(r'/static/[^"]+\.[0-9a-f]{12}\.css', page.text).group(0)
            static = get(https + css, headers={"Accept-Encoding": "gzip"})
            assert static.status_code == 200
            assert "max-age=31536000" in static.headers["Cache-Control"]
            assert static.headers.get("Content-Encoding") == "gzip"  # collectstatic's copy
            access = (nginx_dir / "access.log").read_text()
            assert css in access
            # Plain HTTP goes to HTTPS.
            plain = get(f"http://127.0.0.1:{http_port}/login/", allow_redirects=False)
            assert plain.status_code == 301
            assert plain.headers["Location"] == f"https://{HOST}/login/"
    finally:
        _stop(nginx, timeout=10)
        web_log = _stop(web)
    assert "Traceback" not in web_log, web_log[-3000:]


def get(url, **kw):
    headers = {"Host": HOST, **kw.pop("headers", {})}
    return requests.get(url, headers=headers, verify=False, timeout=30, **kw)


def until_answers(request, *processes, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while True:
        for p in processes:
            assert p.poll() is None, p.communicate()[0][-3000:]
        try:
            answer = request()
            if answer.status_code != 502:  # nginx up, gunicorn not yet
                return answer
        except (requests.ConnectionError, requests.Timeout):  # a loaded machine's first page
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("no answer through nginx")
        time.sleep(0.3)
