"""Serves plotly.js from the installed `plotly` package as `vendor/plotly.min.js`, so
the console's charts need no CDN (clusters are often air-gapped) and no copy of
the 4.6 MB bundle in the repository."""

from pathlib import Path

from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

PATH = "vendor/plotly.min.js"


def _bundle_dir() -> Path:
    import plotly

    return Path(plotly.__file__).parent / "package_data"


class PlotlyFinder(BaseFinder):
    def check(self, **kwargs):
        return []

    def find(self, path, find_all=False, **kwargs):
        if path != PATH:
            return [] if find_all else None
        found = str(_bundle_dir() / "plotly.min.js")
        return [found] if find_all else found

    def list(self, ignore_patterns):
        storage = FileSystemStorage(location=str(_bundle_dir()))
        storage.prefix = "vendor"
        yield "plotly.min.js", storage
