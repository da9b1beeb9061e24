"""The bundled WebShop: a local shopping website for language agents (Yao et al., 2022) that installs with pip,
starts in seconds and runs offline.

* :mod:`webshop_server.catalog` -- a procedural catalog (no download) and a loader for the original data files;
* :mod:`webshop_server.search` -- BM25 search with bm25s (no Java);
* :mod:`webshop_server.reward` -- the original reward formula;
* :mod:`webshop_server.shop` / :mod:`webshop_server.render` -- pages, flow and the text observations;
* :mod:`webshop_server.app` -- the HTTP server (HTML + JSON API); ``webshop-server`` starts it.

Importing this package imports nothing heavy; the submodules import bm25s / rapidfuzz when used.
"""

__version__ = "0.1.0"
