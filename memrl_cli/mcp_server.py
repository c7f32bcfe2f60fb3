"""`memrl mcp`: the bank as Model Context Protocol tools, on the official `mcp` SDK (2.x).

Tools (each answers the JSON object the matching CLI command prints with `--json`, as structured
content and as text; a bad call is a tool error carrying the CLI's one-line message, and nothing is
written): `retrieve`, `remember`, `reward`, `top_memories`, `explain`, `stats`. With `read_only`,
`remember` and `reward` are not offered. Transports: stdio (the default), or streamable HTTP at
`http://HOST:PORT/mcp` (see `memrl_cli.serve` for the bind and token rules).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field, ValidationError

from memrl_cli import __version__
from memrl_cli.errors import MemrlError, error_object
from memrl_cli.learn import DEFAULT_ALPHA
from memrl_cli.serve import BankService, TokenGate, check_bind, parse_address, run_http

INSTRUCTIONS = (
    "memrl is an episodic memory that learns which past experiences help. At the start of a task, call "
    "`retrieve` with the task text and use the memories it returns; keep its retrieval_id. When the outcome "
    "is known, call `reward` with that retrieval_id (1 success, -1 failure, or a value in between). At the "
    "end, call `remember` with the task as intent and a short reusable script (after a success) or a "
    "reflection on what went wrong (after a failure) as experience.")


def _error(exc: MemrlError) -> CallToolResult:
    """A tool error: the CLI's one-line message as text, its JSON error as structured content."""
    error = error_object(exc)
    return CallToolResult(content=[TextContent(type="text", text=error["error"]["message"])],
                          structured_content=error, is_error=True)


def _result(call: Callable[[], dict[str, Any]]) -> CallToolResult:
    """A tool's answer: the CLI's JSON object, or a tool error with the CLI's one-line message."""
    try:
        data = call()
    except MemrlError as exc:
        return _error(exc)
    return CallToolResult(content=[TextContent(type="text", text=json.dumps(data, ensure_ascii=False))],
                          structured_content=data)


class MemoryServer(MCPServer):
    """MCPServer whose argument errors are one line too (the SDK reports pydantic's multi-line text)."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if not isinstance(exc.__cause__, ValidationError):
                raise
            first = exc.__cause__.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            return _error(MemrlError(f"argument {where} of {name}: {first['msg']}"))


def build_server(service: BankService) -> MCPServer:
    """An MCP server whose tools run `service`'s operations (on worker threads)."""
    server: MCPServer = MemoryServer("memrl", instructions=INSTRUCTIONS, version=__version__, log_level="WARNING")
    reads = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False))
    def retrieve(query: Annotated[str, Field(description="The task, in the words you would use to describe it.")],
                 k1: Annotated[int, Field(description="How many memories to recall by similarity.")] = 5,
                 k2: Annotated[int, Field(description="How many of those to return, ranked by similarity and learned utility.")] = 3,
                 lam: Annotated[float, Field(description="λ in [0, 1]: weight of learned utility Q against similarity.")] = 0.5,
                 threshold: Annotated[float, Field(description="Minimum cosine similarity to recall a memory.")] = 0.5,
                 ) -> CallToolResult:
        """Call at the start of a task: the memories of similar past tasks that proved most useful, best first,
        and a retrieval_id. Keep the retrieval_id and pass it to `reward` once you know whether the task succeeded."""
        return _result(lambda: service.retrieve(query, k1, k2, lam, threshold))

    @server.tool(annotations=reads)
    def top_memories(n: Annotated[int, Field(description="How many memories.")] = 10) -> CallToolResult:
        """The memories with the highest learned utility Q (most useful so far)."""
        return _result(lambda: service.top_memories(n))

    @server.tool(annotations=reads)
    def explain(retrieval_id: Annotated[int, Field(description="A retrieval_id from `retrieve`.")]) -> CallToolResult:
        """Why a retrieval chose what it chose: every candidate with its similarity, Q and score."""
        return _result(lambda: service.explain(retrieval_id))

    @server.tool(annotations=reads)
    def stats() -> CallToolResult:
        """The bank's size, Q distribution, embedder and engine."""
        return _result(service.stats)

    if service.read_only:
        return server

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True,
                                             open_world_hint=False))
    def remember(intent: Annotated[str, Field(description="The task this experience is about (what future tasks are matched on).")],
                 experience: Annotated[str, Field(description="What to reuse: a short script of the steps that worked, "
                                                             "or a reflection on what went wrong and what to do instead.")],
                 outcome: Annotated[str, Field(description="success, failure or unknown.")] = "unknown",
                 task_id: Annotated[str | None, Field(description="Your id for the task.")] = None,
                 source: Annotated[str | None, Field(description="Where the memory came from.")] = None,
                 ) -> CallToolResult:
        """Call at the end of a task: store what was learned, a reusable script after a success or a reflection
        after a failure. An exact duplicate is not stored twice (created is false)."""
        return _result(lambda: service.remember(intent, experience, outcome, task_id, source))

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                                             open_world_hint=False))
    def reward(reward: Annotated[float, Field(description="1 for success, -1 (or 0) for failure, or a value in between.")],
               retrieval_id: Annotated[int | None, Field(description="The retrieval_id `retrieve` returned for this task.")] = None,
               memory_ids: Annotated[list[int] | None, Field(description="Or: reward these memory ids directly.")] = None,
               alpha: Annotated[float, Field(description="Learning rate α in Q ← Q + α(R − Q).")] = DEFAULT_ALPHA,
               source: Annotated[str | None, Field(description="Where the reward came from (kept in the ledger).")] = None,
               ) -> CallToolResult:
        """Call once the task's outcome is known: moves the learned utility Q of the memories that retrieval
        selected toward the reward, so useful memories rank higher next time. One reward per retrieval."""
        return _result(lambda: service.reward([{"reward": reward, "retrieval_id": retrieval_id,
                                                "memory_ids": memory_ids, "alpha": alpha, "source": source}]))

    return server


def serve(location: str, *, http: str | None = None, token: str | None = None, read_only: bool = False,
          selector: str = "memrl") -> None:
    """Serve the bank at `location` over stdio, or over streamable HTTP at `http` ("HOST:PORT"); the
    retrieve tool selects with `selector` (memrl_cli.retrieve.SELECTORS)."""
    address = parse_address(http) if http is not None else None
    if address is not None:
        check_bind(address[0], token)
    service = BankService(location, read_only, selector)
    try:
        server = build_server(service)
        if address is None:
            server.run("stdio")
        else:
            app = TokenGate(server.streamable_http_app(host=address[0]), token, bearer=True)
            run_http(app, address[0], address[1], "MCP server (streamable HTTP at /mcp)")
    finally:
        service.close()
