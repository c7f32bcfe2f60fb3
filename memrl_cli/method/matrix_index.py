"""The in-process Phase-A index: the bank's vectors as one float32 matrix, optionally with sign bits.

`index="numpy"` scans the whole matrix (exact). `index="bit"` first ranks every memory by the
Hamming distance between the signs of its vector and of the query's (48 bytes per 384-d
memory, compared with XOR and popcount), then re-scores a shortlist of the closest with exact
float cosine: much less memory traffic than a float scan at large sizes, and exact whenever
the true top-k1 are in the shortlist (see docs/performance.md for its measured recall).
Signs are taken after subtracting the mean vector of the first memories loaded: real
embeddings share a common direction, and uncentred sign bits would mostly encode it.

Memories are append-only, so the index grows by appending rows into buffers whose
capacity doubles (no copy of the whole matrix per new memory).
"""

from __future__ import annotations

import numpy as np

from memrl_cli.method.retrieval import phase_a

SHORTLIST_PER_K1 = 50  # bit index: memories re-scored in float, per recalled memory,
SHORTLIST_SHARE = 200  # … or one in this many memories,
SHORTLIST_MIN = 1000  # … and at least this many
SHORTLIST_PER_CANDIDATE = 4  # a wide search (grouped recall) re-scores at least this many per memory it returns


def sign_bits(vectors: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """The signs of each row minus `centre`, packed into 64-bit words: shape (words, rows)."""
    packed = np.packbits(vectors > centre, axis=1)
    pad = -packed.shape[1] % 8
    if pad:
        packed = np.pad(packed, ((0, 0), (0, pad)))
    return np.ascontiguousarray(packed.view(np.uint64).T)


class MatrixIndex:
    """Ids and unit vectors of every memory in this process, with an exact or bit-shortlisted search."""

    def __init__(self, bits: bool = False) -> None:
        self.bits = bits
        self._ids = np.zeros(0, dtype=np.int64)
        self._matrix = np.zeros((0, 0), dtype=np.float32)
        self._signs = np.zeros((0, 0), dtype=np.uint64)  # (words, capacity): one contiguous row per word
        self._centre = np.zeros(0, dtype=np.float32)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    @property
    def ids(self) -> np.ndarray:
        """Memory ids, ascending."""
        return self._ids[:self._n]

    @property
    def matrix(self) -> np.ndarray:
        """One unit vector per id (a view: do not modify)."""
        return self._matrix[:self._n]

    @property
    def last_id(self) -> int:
        """The highest id held, or 0."""
        return int(self._ids[self._n - 1]) if self._n else 0

    def extend(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Append memories (ids above `last_id`)."""
        n, add = self._n, len(ids)
        if not add:
            return
        if n + add > len(self._ids) or self._matrix.shape[1] != vectors.shape[1]:
            capacity = max(n + add, 2 * len(self._ids), 1024)
            self._ids = _grown(self._ids, n, (capacity,))
            self._matrix = _grown(self._matrix, n, (capacity, vectors.shape[1]))
            if self.bits:
                signs = np.empty(((vectors.shape[1] + 63) // 64, capacity), dtype=np.uint64)
                if n:
                    signs[:, :n] = self._signs[:, :n]
                self._signs = signs
        self._ids[n:n + add] = ids
        self._matrix[n:n + add] = vectors
        if self.bits:
            if not n:
                self._centre = vectors.mean(axis=0)
            self._signs[:, n:n + add] = sign_bits(vectors, self._centre)
        self._n = n + add

    def shortlist(self, k1: int, recalled: int | None = None) -> int:
        """How many memories the bit index re-scores in float for a search of `k1` (see `search`)."""
        recalled = k1 if recalled is None else recalled
        return max(SHORTLIST_MIN, SHORTLIST_PER_K1 * recalled, SHORTLIST_PER_CANDIDATE * k1, self._n // SHORTLIST_SHARE)

    def search(self, vector: np.ndarray, k1: int, threshold: float, mask: np.ndarray | None = None,
               recalled: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Phase A over the held memories (with `mask`, a boolean per id, only those it marks True):
        (ids, similarities), best first.

        `recalled`: when the search is wider than what is recalled from it (grouped recall searches
        hundreds of memories to recall k1 groups), the k1 that counts; the bit index sizes its shortlist
        for those (and at least `SHORTLIST_PER_CANDIDATE` per memory returned), not 50 per memory returned.
        """
        eligible = self._n if mask is None else int(mask.sum())
        if not eligible:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        vector = np.ascontiguousarray(vector, dtype=np.float32)
        shortlist = self.shortlist(k1, recalled)
        if not self.bits or eligible <= shortlist:
            sims = self.matrix @ vector  # all rows, then the mask: cheaper than copying the masked matrix
            return phase_a(sims, self.ids, k1, threshold) if mask is None else \
                phase_a(sims[mask], self.ids[mask], k1, threshold)
        query = sign_bits(vector[None, :], self._centre)[:, 0]
        distance = np.zeros(self._n, dtype=np.uint16)
        for word, bits in zip(query, self._signs):
            distance += np.bitwise_count(bits[:self._n] ^ word)
        if mask is not None:  # beyond any real distance: never shortlisted, as more than `shortlist` are eligible
            distance[~mask] = 64 * len(self._signs) + 1
        # the shortlist: every memory at or below the smallest distance that admits `shortlist` of them
        cutoff = int(np.searchsorted(np.cumsum(np.bincount(distance)), shortlist))
        rows = np.flatnonzero(distance <= cutoff)
        return phase_a(self._matrix[rows] @ vector, self._ids[rows], k1, threshold)


def _grown(array: np.ndarray, keep: int, shape: tuple[int, ...]) -> np.ndarray:
    out = np.empty(shape, dtype=array.dtype)
    if keep:
        out[:keep] = array[:keep]
    return out
