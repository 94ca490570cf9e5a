"""Settings from the environment: laptop defaults, and a production mode that is strict."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def manage(*args, env_overrides, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("REBOUND_")}
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    env["REBOUND_VAR_DIR"] = str(tmp_path)
    env.update(env_overrides)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_production_refuses_to_start_without_a_secret_key(tmp_path):
    r = manage("check", env_overrides={"REBOUND_DEBUG": "0"}, tmp_path=tmp_path)
    assert r.returncode != 0
    assert "REBOUND_SECRET_KEY must be set" in r.stderr


def test_production_passes_check_deploy(tmp_path):
    r = manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        env_overrides={
            "REBOUND_DEBUG": "0",
            "REBOUND_SECRET_KEY": "k" * 20 + "-production-secret-with-enough-entropy-1234567890",
            "REBOUND_ALLOWED_HOSTS": "rebound.example.org",
        },
        tmp_path=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_defaults_run_on_a_laptop(tmp_path):
    """No environment at all: SQLite under var/ and the embedded broker."""
    code = (
        "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE','console.settings');"
        "django.setup(); from django.conf import settings as s;"
        "d = s.DATABASES['default'];"
        "print(d['ENGINE'], d['NAME'], s.CELERY_BROKER_URL, s.DEBUG)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("REBOUND_")}
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    env["REBOUND_VAR_DIR"] = str(tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    engine, name, broker, debug = out.stdout.split()
    assert engine == "django.db.backends.sqlite3"
    assert name == str(tmp_path / "rebound.sqlite3")
    assert broker.startswith("filesystem://")
    assert debug == "True"


def test_environment_selects_postgres_and_redis(tmp_path):
    code = (
        "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE','console.settings');"
        "django.setup(); from django.conf import settings as s;"
        "print(s.DATABASES['default']['ENGINE'], s.CELERY_BROKER_URL, s.ALLOWED_HOSTS)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("REBOUND_")}
    env.update(
        DATABASE_URL="postgres://u@db.internal:5432/rebound",
        REDIS_URL="redis://cache.internal:6379/2",
        REBOUND_ALLOWED_HOSTS="a.example,b.example",
        REBOUND_VAR_DIR=str(tmp_path),
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip().split(maxsplit=2) == [
        "django.db.backends.postgresql",
        "redis://cache.internal:6379/2",
        "['a.example', 'b.example']",
    ]


def test_a_silence_threshold_that_is_no_number_of_seconds_is_refused(tmp_path):
    for bad in ("0", "-5", "nan", "two minutes", "inf"):
        r = manage("check", env_overrides={"REBOUND_JOB_SILENT_S": bad}, tmp_path=tmp_path)
        assert r.returncode != 0, bad
        assert "REBOUND_JOB_SILENT_S must be a number of seconds above 0" in r.stderr, bad
    r = manage("check", env_overrides={"REBOUND_JOB_SILENT_S": "300"}, tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr


def settings_of(env_overrides, tmp_path, expression):
    """`expression` evaluated on the settings of a process with this environment."""
    code = (
        "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE','console.settings');"
        f"django.setup(); from django.conf import settings as s; print(repr({expression}))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("REBOUND_")}
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    env.update(REBOUND_VAR_DIR=str(tmp_path), **env_overrides)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_a_transaction_pooler_turns_off_what_lives_in_a_session(tmp_path):
    url = "postgres://u@pgbouncer.internal:6432/rebound?server_side_binding=true"
    expression = (
        "(s.DATABASES['default']['DISABLE_SERVER_SIDE_CURSORS'], s.DATABASES['default']['OPTIONS'])"
    )
    out = settings_of(
        {"DATABASE_URL": url, "REBOUND_DB_POOLER": "transaction"}, tmp_path, expression
    )
    assert out.returncode == 0, out.stderr
    cursors, options = eval(out.stdout)
    assert cursors is True
    assert options["prepare_threshold"] is None
    assert options["server_side_binding"] is False

    # Without a pooler, nothing changes (a direct connection may keep its cursors).
    out = settings_of(
        {"DATABASE_URL": url}, tmp_path, "s.DATABASES['default']['DISABLE_SERVER_SIDE_CURSORS']"
    )
    assert out.stdout.strip() == "False", out.stderr


def test_a_pooler_setting_that_means_nothing_is_refused(tmp_path):
    r = manage("check", env_overrides={"REBOUND_DB_POOLER": "statement"}, tmp_path=tmp_path)
    assert r.returncode != 0
    assert "REBOUND_DB_POOLER must be transaction, session or unset" in r.stderr
    r = manage("check", env_overrides={"REBOUND_DB_POOLER": "transaction"}, tmp_path=tmp_path)
    assert r.returncode != 0  # SQLite: there is no pooler to speak of
    assert "needs a PostgreSQL DATABASE_URL" in r.stderr


def test_the_queues_derive_from_one_prefix(tmp_path):
    """A worker started without -Q consumes every queue of its installation's prefix."""
    out = settings_of(
        {"REBOUND_CELERY_QUEUE": "site-b"},
        tmp_path,
        "[q.name for q in s.CELERY_TASK_QUEUES]",
    )
    assert eval(out.stdout) == ["site-b", "site-b.detect", "site-b.recovery", "site-b.upkeep"]
