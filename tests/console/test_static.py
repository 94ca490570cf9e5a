"""Static files as browsers get them: plotly.js (4.8 MB) compressed, cached for long
where its URL carries its hash (production) and for a while in debug mode; a favicon;
a missing file is a 404."""

import gzip

import pytest
from django.templatetags.static import static
from django.test import Client

pytestmark = pytest.mark.django_db

GZIP = {"HTTP_ACCEPT_ENCODING": "gzip, deflate, br"}
MB = 1024 * 1024


def _body(response) -> bytes:
    return b"".join(response.streaming_content)


def test_debug_mode_serves_plotly_compressed_and_cached_a_while(settings):
    settings.DEBUG = True  # WhiteNoise serves from the finders (read when the client starts)
    client = Client()
    url = static("vendor/plotly.min.js")
    r = client.get(url, **GZIP)
    assert r.status_code == 200 and r["Content-Encoding"] == "gzip"
    packed = _body(r)
    assert len(packed) < 2 * MB and gzip.decompress(packed).startswith(b"/**")
    assert "Accept-Encoding" in r["Vary"]
    max_age = int(r["Cache-Control"].split("max-age=")[1].split(",")[0])
    assert max_age >= 60
    plain = client.get(url)
    assert "Content-Encoding" not in plain and len(_body(plain)) > 4 * MB


def test_production_serves_hashed_names_compressed_and_immutable(settings, collected_static):
    settings.DEBUG = False
    settings.STATIC_ROOT = collected_static / "staticfiles"
    settings.STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }
    url = static("vendor/plotly.min.js")
    assert url != "/static/vendor/plotly.min.js"  # the name carries the content's hash
    r = Client().get(url, **GZIP)
    assert r.status_code == 200 and r["Content-Encoding"] == "gzip"
    assert len(_body(r)) < 2 * MB
    assert "immutable" in r["Cache-Control"]
    assert int(r["Cache-Control"].split("max-age=")[1].split(",")[0]) >= 365 * 86400
    assert Client().get("/static/nonexistent.js").status_code == 404


def test_pages_link_a_favicon_that_is_served(client, personas, settings):
    client.force_login(personas["viewer"].user)
    html = client.get("/").content.decode()
    assert f'<link rel="icon" href="{static("favicon.svg")}"' in html
    login = Client().get("/login/").content.decode()
    assert 'rel="icon"' in login
    settings.DEBUG = True
    browser = Client()
    r = browser.get(static("favicon.svg"))
    assert r.status_code == 200 and r["Content-Type"].startswith("image/svg+xml")
    r = browser.get("/favicon.ico")
    assert r.status_code == 302 and r["Location"] == static("favicon.svg")
