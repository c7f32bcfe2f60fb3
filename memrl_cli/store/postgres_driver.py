"""PostgreSQL's side of a bank: the driver (psycopg 3 with pgvector's adapter, imported only for a
`postgresql://` bank), the connection that takes the bank's `?`-placeholder SQL, and the statements
only PostgreSQL runs (the HNSW graph's table and trigger, the reward as one statement)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from memrl_cli.errors import MemrlError

ADVISORY_LOCK = 0x6D656D726C  # "memrl": serialises migrations and HNSW index builds of one database
MIN_PGVECTOR = (0, 5)  # HNSW arrived in 0.5; 0.8 adds iterative scans (docs/postgres.md)
HNSW_EF_SEARCH = 200  # recall@k1 0.91-1.00 at 100k on clustered vectors, by build; docs/performance-postgres.md
HNSW_EF_SEARCH_MAX = 1000  # pgvector's largest hnsw.ef_search: wider searches continue by iterative scan
CHANGES = "meta_version"  # meta key: a counter bumped by every write of meta or of new memories
# The HNSW graph indexes a copy of the vectors in a table of their own, filled by a trigger on new memories:
# a reward or a receipt writes a new version of the memory row, which on the memories table itself would cost a
# search of the graph each (docs/postgres.md). A bank indexed by an earlier memrl keeps its graph on memories
# (OLD_GRAPH) until the index is built again, which moves it. The build blocks writes to memories, not reads:
# no statement of it takes an exclusive lock on memories before its last (the old graph's drop).
OLD_GRAPH = "memories_hnsw"
GRAPH_TABLE_SQL = (
    "CREATE TABLE IF NOT EXISTS memory_vectors (id BIGINT PRIMARY KEY REFERENCES memories (id), "
    "embedding vector({dim}) NOT NULL)",
    "CREATE OR REPLACE FUNCTION memrl_copy_vectors() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT "
    "AS $$ BEGIN INSERT INTO memory_vectors (id, embedding) SELECT id, embedding FROM added; RETURN NULL; END $$",
)
GRAPH_TRIGGER_SQL = ("CREATE TRIGGER memories_copy_vectors AFTER INSERT ON memories REFERENCING NEW TABLE AS added "
                     "FOR EACH STATEMENT EXECUTE FUNCTION memrl_copy_vectors()")
GRAPH_INDEX_SQL = (
    # after the trigger (which waits for writers in flight and holds new ones): every memory committed so far
    "INSERT INTO memory_vectors (id, embedding) SELECT id, embedding FROM memories WHERE content_hash NOT LIKE "
    "'erased:%' ON CONFLICT (id) DO NOTHING",
    "CREATE INDEX IF NOT EXISTS memory_vectors_hnsw ON memory_vectors USING hnsw (embedding vector_cosine_ops)",
    f"DROP INDEX IF EXISTS {OLD_GRAPH}",
)
FIRING = ("O", "A")  # pg_trigger.tgenabled of a trigger that fires in ordinary sessions
DROP_GRAPH_SQL = (f"DROP INDEX IF EXISTS {OLD_GRAPH}", "DROP TRIGGER IF EXISTS memories_copy_vectors ON memories",
                  "DROP TABLE IF EXISTS memory_vectors", "DROP FUNCTION IF EXISTS memrl_copy_vectors()")
REWARD_FIELDS = ("rid", "mid", "r", "a", "f", "source")  # the parameters of a reward entry (Store.apply_rewards)
# Binary COPY types of `memrl_ingest` for MEMORY_COLUMNS (memrl_cli.bank.records), after its ordinal `id`.
COPY_TYPES = {"q": "float8", "q_init": "float8", "visits": "int8", "id": "int8", "embedding": "vector"}
# One reward request as one statement: lock the memories in id order, move Q by the rule (the same float8
# arithmetic as learn.q_update; greatest() ignores a NULL floor), update them and append the ledger rows
# in request order. If a memory id is unknown, nothing is written and fewer rows come back.
REWARD_SQL = """
WITH req AS (
    SELECT * FROM unnest(%(rid)s::int8[], %(mid)s::int8[], %(r)s::float8[], %(a)s::float8[], %(f)s::float8[],
                         %(source)s::text[]) WITH ORDINALITY AS t (rid, mid, r, a, f, source, ord)),
locked AS (SELECT id, q FROM memories WHERE id = ANY(%(mid)s::int8[]) ORDER BY id FOR UPDATE),
moved AS (
    SELECT req.*, locked.q AS q_before, greatest(req.f, locked.q + req.a * (req.r - locked.q)) AS q_after
    FROM req JOIN locked ON locked.id = req.mid),
complete AS (SELECT count(*) = %(n)s AS ok FROM locked),
updated AS (
    UPDATE memories m SET q = moved.q_after, visits = m.visits + 1, updated_at = %(stamp)s
    FROM moved WHERE m.id = moved.mid AND (SELECT ok FROM complete) RETURNING m.id),
ledger AS (
    INSERT INTO rewards (retrieval_id, memory_id, kind, reward, alpha, q_floor, q_before, q_after, created_at, source)
    SELECT rid, mid, 'reward', r, a, f, q_before, q_after, %(stamp)s, source FROM moved
    WHERE (SELECT ok FROM complete) ORDER BY ord RETURNING id)
SELECT mid, q_before, q_after, (SELECT count(*) FROM updated) + (SELECT count(*) FROM ledger) FROM moved ORDER BY ord
"""
# The same for one memory, with scalar parameters: cheap to plan, so PostgreSQL settles on its generic plan by
# itself, without REWARD_SQL's pipeline; outside a transaction it is sent alone, its own transaction.
REWARD_ONE_SQL = """
WITH locked AS (SELECT id, q FROM memories WHERE id = %(mid)s::int8 FOR UPDATE),
updated AS (
    UPDATE memories m SET q = greatest(%(f)s::float8, l.q + %(a)s::float8 * (%(r)s::float8 - l.q)),
                          visits = m.visits + 1, updated_at = %(stamp)s::text
    FROM locked l WHERE m.id = l.id RETURNING m.id, l.q AS q_before, m.q AS q_after),
ledger AS (
    INSERT INTO rewards (retrieval_id, memory_id, kind, reward, alpha, q_floor, q_before, q_after, created_at, source)
    SELECT %(rid)s::int8, id, 'reward', %(r)s::float8, %(a)s::float8, %(f)s::float8, q_before, q_after,
           %(stamp)s::text, %(source)s::text FROM updated RETURNING id)
SELECT id, q_before, q_after, (SELECT count(*) FROM ledger) FROM updated
"""

class PgConnection:
    """A psycopg connection that takes the bank's `?`-placeholder SQL."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def execute(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> Any:
        """Run one statement; returns the psycopg cursor (fetchone, fetchall, iteration, description).
        Results come in binary format: a vector then loads with one numpy call instead of parsing
        its text (~8x the time of the whole read for 384-d vectors)."""
        return self.raw.execute(pg_sql(sql), tuple(args), binary=True) if args else self.raw.execute(sql, binary=True)

    def executemany(self, sql: str, rows: list[tuple[Any, ...]]) -> Any:
        """Run one statement for each row."""
        cursor = self.raw.cursor()
        cursor.executemany(pg_sql(sql), rows)
        return cursor

    def close(self) -> None:
        """Close the connection."""
        self.raw.close()


@lru_cache(maxsize=512)
def pg_sql(sql: str) -> str:
    """The shared SQL (`?` placeholders) in psycopg's dialect (`%s`)."""
    return sql.replace("%", "%%").replace("?", "%s")


def import_driver() -> tuple[Any, Any]:
    try:
        import psycopg
        from pgvector.psycopg import register_vector
    except ImportError:
        raise MemrlError("a PostgreSQL bank needs psycopg and pgvector: pip install 'memrl[postgres]'") from None
    return psycopg, register_vector
