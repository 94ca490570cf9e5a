"""Serves plotly.js from the installed `plotly` package as `vendor/plotly.min.js`, so
the console's charts need no CDN (clusters are often air-gapped) and no copy of
the 4.6 MB bundle in the repository.

The bundle is copied once per plotly version under VAR_DIR/vendor with a gzip copy
beside it (and a brotli one where `brotli` is installed): WhiteNoise serves those
to browsers that accept them in debug mode, where it serves from the finders. In
production `collectstatic` compresses and hashes every file itself."""

from __future__ import annotations

import gzip
import os
import tempfile
from pathlib import Path

from django.conf import settings
from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

PATH = "vendor/plotly.min.js"
NAME = "plotly.min.js"


def _bundle() -> tuple[Path, str]:
    import plotly

    return Path(plotly.__file__).parent / "package_data" / NAME, plotly.__version__


def _write_atomically(path: Path, data: bytes) -> None:
    """Whole or not at all: gunicorn's workers may do this at the same time."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _compressed(data: bytes) -> dict[str, bytes]:
    out = {".gz": gzip.compress(data, compresslevel=9, mtime=0)}
    try:
        import brotli
    except ImportError:
        return out
    out[".br"] = brotli.compress(data)
    return out


def served_dir() -> Path:
    """The folder holding this plotly version's bundle and its compressed copies."""
    source, version = _bundle()
    folder = Path(settings.VAR_DIR) / "vendor" / f"plotly-{version}"
    target = folder / NAME
    if not (target.exists() and target.with_name(NAME + ".gz").exists()):
        folder.mkdir(parents=True, exist_ok=True)
        data = source.read_bytes()
        for suffix, packed in _compressed(data).items():
            _write_atomically(target.with_name(NAME + suffix), packed)
        _write_atomically(target, data)  # last: its presence says the rest is there
    return folder


class PlotlyFinder(BaseFinder):
    def check(self, **kwargs):
        return []

    def find(self, path, find_all=False, **kwargs):
        if path != PATH:
            # Django's finders answer [] when they find nothing: None would be taken
            # for a match (and WhiteNoise would stat() it).
            return []
        found = str(served_dir() / NAME)
        return [found] if find_all else found

    def list(self, ignore_patterns):
        storage = FileSystemStorage(location=str(served_dir()))
        storage.prefix = "vendor"
        yield NAME, storage
