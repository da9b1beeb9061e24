"""BM25 search over the catalog, with no Java: bm25s (a maintained PyPI package, numpy + scipy sparse) instead of
pyserini / Lucene.

Same fields as the original's index (title, description, first bullet point, option text; see
:meth:`webshop_server.catalog.Product.search_text`), Lucene's BM25 variant with Anserini's defaults (k1 = 0.9,
b = 0.4), the analyzer of :mod:`webshop_server.text`. Only documents that match at least one query term are
returned (as Lucene does), at most ``SEARCH_RETURN_N`` = 50, best first; ties are broken by catalog order so results
are reproducible.

The index is built once per catalog and cached under :func:`default_cache_root` ``/<fingerprint>`` (ragen's cache
folder, or the ``cache_dir`` given); later starts memory-map it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from webshop_server.catalog import Catalog
from webshop_server.text import analyze

SEARCH_RETURN_N = 50
MAX_QUERY_TOKENS = 64  # longer queries are cut (a 1 MB query must not cost more than a normal one)
INDEX_VERSION = "bm25s-v1"
K1, B = 0.9, 0.4

log = logging.getLogger("webshop_server")


def default_cache_root() -> Path:
    """Where indexes are cached when no ``cache_dir`` is given: ``$RAGEN_CACHE_DIR/webshop``, else
    ``$XDG_CACHE_HOME/ragen/webshop`` (default ``~/.cache/ragen/webshop``), created. The same folder as ragen's own
    cache (``ragen_envs.cache.cache_dir("webshop")``, which the env's embedded server passes), found here without
    importing ragen_envs: the server stands below the envs."""
    root = os.environ.get("RAGEN_CACHE_DIR")
    base = Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ragen"
    path = base / "webshop"
    path.mkdir(parents=True, exist_ok=True)
    return path


class SearchEngine:
    """A BM25 index of a catalog. ``search(query)`` returns catalog indices, best first."""

    def __init__(self, retriever, n_docs: int) -> None:
        self._retriever = retriever
        self._vocab: dict[str, int] = retriever.vocab_dict
        self.n_docs = n_docs

    # -------------------------------------------------------------- build / load
    @classmethod
    def for_catalog(
        cls,
        catalog: Catalog,
        cache_dir: str | Path | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> "SearchEngine":
        """Load the cached index of ``catalog`` or build (and cache) it."""
        import bm25s

        root = Path(cache_dir) if cache_dir is not None else default_cache_root()
        path = root / catalog.fingerprint() / INDEX_VERSION
        if (path / "ready.json").is_file():
            try:
                retriever = bm25s.BM25.load(str(path), mmap=True, load_vocab=True)
                return cls(retriever, len(catalog))
            except Exception as exc:  # a damaged cache is rebuilt, never fatal
                log.warning("search index cache at %s unreadable (%s); rebuilding", path, exc)
        retriever = cls._build(catalog, progress)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=path.parent))
            retriever.save(str(tmp))
            (tmp / "ready.json").write_text(json.dumps({"docs": len(catalog), "version": INDEX_VERSION}))
            try:
                os.rename(tmp, path)  # atomic: concurrent builders race harmlessly
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError as exc:
            log.warning("could not cache the search index at %s: %s", path, exc)
        return cls(retriever, len(catalog))

    @staticmethod
    def _build(catalog: Catalog, progress: Callable[[int, int], None] | None):
        import bm25s

        vocab: dict[str, int] = {}
        ids: list[list[int]] = []
        n = len(catalog)
        t0 = time.perf_counter()
        for i, text in enumerate(catalog.documents()):
            doc = []
            for token in analyze(text):
                tid = vocab.get(token)
                if tid is None:
                    tid = vocab[token] = len(vocab)
                doc.append(tid)
            ids.append(doc)
            if progress is not None and (i + 1) % 5000 == 0:
                progress(i + 1, n)
        if progress is not None:
            progress(n, n)
        retriever = bm25s.BM25(k1=K1, b=B, method="lucene")
        retriever.index((ids, vocab), show_progress=False)
        log.info("indexed %d products in %.1fs", n, time.perf_counter() - t0)
        return retriever

    # -------------------------------------------------------------- query
    def query_ids(self, query: str) -> list[int]:
        tokens = analyze(query)[:MAX_QUERY_TOKENS]
        return [self._vocab[t] for t in tokens if t in self._vocab]

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[int]:
        """Catalog indices of the best ``k`` matching products, best first (empty when nothing matches)."""
        ids = self.query_ids(query)
        if not ids:
            return []
        scores = np.asarray(self._retriever.get_scores_from_ids(ids), dtype=np.float32)
        k = min(k, scores.shape[0])
        if k < scores.shape[0]:
            cand = np.argpartition(-scores, k - 1)[:k]
            # include every document tied with the k-th score so the tie-break below is by catalog order
            kth = scores[cand].min()
            cand = np.flatnonzero(scores >= kth)
        else:
            cand = np.arange(scores.shape[0])
        cand = cand[scores[cand] > 0]
        order = np.lexsort((cand, -scores[cand]))  # score descending, then index ascending
        return [int(i) for i in cand[order][:k]]
