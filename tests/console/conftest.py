"""What the console's tests of production mode share: its environment, and static
files collected once as `manage.py collectstatic` leaves them in production."""

import os
import subprocess
import sys

import pytest

from tests.processes import ROOT

PRODUCTION = {
    "REBOUND_DEBUG": "0",
    "REBOUND_SECRET_KEY": "a-test-key-long-enough-for-the-deploy-checks-0123456789",
    "REBOUND_ALLOWED_HOSTS": "127.0.0.1,localhost",
    "REBOUND_SSL_REDIRECT": "0",  # the tests speak plain HTTP to the server
}


@pytest.fixture(scope="session")
def collected_static(tmp_path_factory):
    """A var folder whose staticfiles/ holds what collectstatic writes in production:
    hashed names, a manifest, gzip copies."""
    var = tmp_path_factory.mktemp("var-production")
    env = {**os.environ, **PRODUCTION, "REBOUND_VAR_DIR": str(var)}
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"],
        cwd=ROOT,
        env=env,
        check=True,
    )
    return var
