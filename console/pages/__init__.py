"""The console's server-rendered pages, one module per page family. Each module
lists its routes in `urls`; console/page_urls.py joins them."""
