"""`memrl mcp`: the bank as Model Context Protocol tools, on the official `mcp` SDK (2.x).

Tools (each answers the JSON object the matching CLI command prints with `--json`, as structured
content and as text): `retrieve`, `remember`, `reward` (a retrieval_id), `reward_task` (a task_id given
to `retrieve`), `reward_memories` (memory ids), `top_memories`, `explain`, `stats`. With `read_only`,
`remember` and the three reward tools are not offered, and neither the instructions nor the descriptions
mention them. Every tool but `stats` takes a `scope` (default: the server's `--scope`, else none) and acts
in it alone (`memrl_cli.serving.service.BankService`).

The contract is in each tool's input schema: bounds on every number (integers and numbers strictly: the
string "3" is not an id), the outcome's enum, the reward within the bank's reward range, the length of a
query, and `additionalProperties: false`. A call outside it (or any bad call) is a tool error with one
line naming the argument, and nothing is written. The server, not the model, sets the learning rate α
(`memrl mcp --alpha`). Rewarding a retrieval, a task and memory ids are three tools rather than one with
an either/or: Claude's and OpenAI's tool APIs refuse `oneOf`/`anyOf` at the top of an input schema, so
each schema says what it requires with `required` alone. Results never name the bank's file or URL
(`stats` has no `path`), nor do errors.

Transports: stdio (the default), or streamable HTTP at `http://HOST:PORT/mcp` (see
`memrl_cli.serving.service` for the bind and token rules).
"""

# No `from __future__ import annotations`: the tools' argument types (the reward's bounds) are the
# bank's, built in `build_server`, and the SDK reads them from the functions' evaluated annotations.
import json
from collections.abc import Callable
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import ConfigDict, Field, ValidationError

from memrl_cli import __version__
from memrl_cli.errors import MemrlError, error_object
from memrl_cli.method.learning import DEFAULT_ALPHA, check_reward, number
from memrl_cli.bank.ledger import RewardedAlready
from memrl_cli.bank.records import MAX_SCOPE_CHARS, MAX_TEXT_BYTES
from memrl_cli.serving.network import TokenGate, check_bind, parse_address, run_http
from memrl_cli.serving.service import BANK_WAIT, BankService, check_wait, private

MAX_K1, MAX_K2, MAX_TOP = 100, 20, 100  # what one call may ask for: recall, memories returned, memories listed
MAX_LABEL = 1000  # characters of a task id or a source
MAX_QUERY = 8000  # characters of a query or an intent: a task as one would describe it, not a whole document
RETRIEVE = {  # the retrieve tool's description; a read-only server names no tool it does not offer
    False: "Call at the start of a task: the memories of similar past tasks that proved most useful, best first, and "
           "a retrieval_id. Keep the retrieval_id and pass it to `reward` once you know whether the task succeeded "
           "(or give a task_id here and pass it to `reward_task`).",
    True: "Call at the start of a task: the memories of similar past tasks that proved most useful, best first, and "
          "a retrieval_id (`explain` shows why they were chosen)."}


def instructions(read_only: bool, bounds: tuple[float, float]) -> str:
    """What the server tells the model; a read-only server names no tool it does not offer."""
    text = ("memrl is an episodic memory that learns which past experiences help. At the start of a task, call "
            "`retrieve` with the task text and use the memories it returns")
    if read_only:
        return text + ("; `explain` shows why they were chosen. This server only reads the memory: "
                       "what it learns is decided elsewhere.")
    return text + ("; keep its retrieval_id. When the outcome is known, call `reward` with that retrieval_id "
                   f"(1 success, -1 failure, or a value in between; the bank accepts [{number(bounds[0])}, "
                   f"{number(bounds[1])}]). At the end, call `remember` with the task as intent and a short reusable "
                   "script (after a success) or a reflection on what went wrong (after a failure) as experience.")


class MemoryServer(MCPServer):
    """MCPServer whose argument errors are one line naming the argument (the SDK reports pydantic's
    multi-line text), and whose results never show where the bank is."""

    def __init__(self, service: BankService, tools: list[Tool], read_only: bool) -> None:
        super().__init__("memrl", instructions=instructions(read_only, service.reward_range()),
                         version=__version__, log_level="WARNING", tools=tools)
        self.location = service.pool.location
        self.arguments = {tool.name: list(tool.parameters["properties"]) for tool in tools}

    def error(self, exc: MemrlError) -> CallToolResult:
        """A tool error: the one-line message as text, its JSON error as structured content."""
        error = error_object(private(exc, self.location))
        return CallToolResult(content=[TextContent(type="text", text=error["error"]["message"])],
                              structured_content=error, is_error=True)

    def result(self, call: Callable[[], dict[str, Any]]) -> CallToolResult:
        """A tool's answer: the CLI's JSON object, or a tool error with its one-line message."""
        try:
            data = call()
        except RewardedAlready as exc:  # the tools cannot repeat a reward: no argument to name
            return self.error(MemrlError(f"retrieval {exc.retrieval_id} was already rewarded; "
                                         "each retrieval takes one reward"))
        except MemrlError as exc:
            return self.error(exc)
        return CallToolResult(content=[TextContent(type="text", text=json.dumps(data, ensure_ascii=False))],
                              structured_content=data)

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if not isinstance(exc.__cause__, ValidationError):
                raise
            first = exc.__cause__.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            if first["type"] == "extra_forbidden":
                known = self.arguments.get(name)
                takes = f"its arguments are {', '.join(known)}" if known else f"{name} takes no arguments"
                return self.error(MemrlError(f"unknown argument {where} of {name}; {takes}"))
            return self.error(MemrlError(f"argument {where} of {name}: {first['msg']}"))


def strict(fn: Callable[..., Any], annotations: ToolAnnotations, description: str | None = None) -> Tool:
    """A tool whose arguments are exactly its parameters: the schema says `additionalProperties: false`
    and a call with any other argument is refused before the tool runs."""
    tool = Tool.from_function(fn, annotations=annotations, description=description)
    base = tool.fn_metadata.arg_model
    model: type[Any] = type(base.__name__, (base,), {"__module__": base.__module__, "model_config": ConfigDict(
        extra="forbid", arbitrary_types_allowed=True)})
    tool.fn_metadata.arg_model = model
    tool.parameters = model.model_json_schema(by_alias=True)
    return tool


Text = Annotated[str, Field(min_length=1, max_length=MAX_TEXT_BYTES)]
Query = Annotated[str, Field(min_length=1, max_length=MAX_QUERY)]
Label = Annotated[str | None, Field(max_length=MAX_LABEL)]
Id = Annotated[int, Field(ge=1, strict=True)]
Whole = Annotated[int, Field(strict=True)]
Number = Annotated[float, Field(strict=True)]
Scope = Annotated[str | None, Field(max_length=MAX_SCOPE_CHARS, description=(
    "Whom the task belongs to (user:alice): the call acts in that scope alone [the server's]."))]


def build_server(service: BankService, alpha: float = DEFAULT_ALPHA) -> MCPServer:
    """An MCP server whose tools run `service`'s operations (on worker threads); rewards move Q at
    learning rate `alpha` (the server's choice, not the model's), within the bank's reward range."""
    low, high = service.reward_range()
    alpha = check_reward(0.0, alpha)[1]
    read_only = service.read_only
    reads = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    server: MemoryServer

    def retrieve(query: Annotated[Query, Field(description="The task, in the words you would use to describe it.")],
                 k1: Annotated[Whole, Field(ge=1, le=MAX_K1, description="How many memories to recall by "
                                                                         "similarity.")] = 5,
                 k2: Annotated[Whole, Field(ge=1, le=MAX_K2, description="How many of those to return, ranked by "
                                                                         "similarity and learned utility.")] = 3,
                 lam: Annotated[Number, Field(ge=0, le=1, description="λ: weight of learned utility Q against "
                                                                      "similarity.")] = 0.5,
                 threshold: Annotated[Number, Field(ge=-1, le=1, description="Minimum cosine similarity to recall "
                                                                             "a memory.")] = 0.5,
                 task_id: Annotated[Label, Field(description="Your id for the task (kept with the retrieval).")] = None,
                 scope: Scope = None) -> CallToolResult:
        return server.result(lambda: service.retrieve(query, k1, k2, lam, threshold, task_id, scope))

    def top_memories(n: Annotated[Whole, Field(ge=1, le=MAX_TOP, description="How many memories.")] = 10,
                     scope: Scope = None) -> CallToolResult:
        """The memories with the highest learned utility Q (most useful so far)."""
        return server.result(lambda: service.top_memories(n, scope))

    def explain(retrieval_id: Annotated[Id, Field(description="A retrieval_id from `retrieve`.")],
                scope: Scope = None) -> CallToolResult:
        """Why a retrieval chose what it chose: every candidate with its similarity, Q and score."""
        return server.result(lambda: service.explain(retrieval_id, scope))

    def stats() -> CallToolResult:
        """The bank's size, Q distribution, reward range, embedder and engine."""
        return server.result(service.stats)

    def remember(intent: Annotated[Query, Field(description="The task this experience is about (what future tasks "
                                                            "are matched on).")],
                 experience: Annotated[Text, Field(description="What to reuse: a short script of the steps that "
                                                               "worked, or a reflection on what went wrong and what "
                                                               "to do instead.")],
                 outcome: Annotated[Literal["success", "failure", "unknown"],
                                    Field(description="How the task ended.")] = "unknown",
                 task_id: Annotated[Label, Field(description="Your id for the task.")] = None,
                 source: Annotated[Label, Field(description="Where the memory came from.")] = None,
                 scope: Scope = None) -> CallToolResult:
        """Call at the end of a task: store what was learned, a reusable script after a success or a reflection
        after a failure. An exact duplicate is not stored twice (created is false)."""
        return server.result(lambda: service.remember(intent, experience, outcome, task_id, source, scope))

    Reward = Annotated[float, Field(ge=low, le=high, strict=True, description=(
        f"1 for success, -1 for failure, or a value in between; within [{number(low)}, {number(high)}]."))]
    Source = Annotated[Label, Field(description="Where the reward came from (kept in the ledger).")]

    def reward(retrieval_id: Annotated[Id, Field(description="The retrieval_id `retrieve` returned for this task.")],
               reward: Reward, source: Source = None, scope: Scope = None) -> CallToolResult:
        """Call once the task's outcome is known: moves the learned utility Q of the memories that retrieval
        selected toward the reward, so useful memories rank higher next time. One reward per retrieval."""
        return server.result(lambda: service.reward([{"retrieval_id": retrieval_id, "reward": reward,
                                                      "alpha": alpha, "source": source}], scope))

    def reward_task(task_id: Annotated[str, Field(min_length=1, max_length=MAX_LABEL, description=(
                        "The task_id given to `retrieve` for this task."))],
                    reward: Reward, source: Source = None, scope: Scope = None) -> CallToolResult:
        """As `reward`, for the latest retrieval made with this task_id."""
        return server.result(lambda: service.reward([{"task": task_id, "reward": reward, "alpha": alpha,
                                                      "source": source}], scope))

    def reward_memories(memory_ids: Annotated[list[Id], Field(min_length=1, max_length=MAX_TOP, description=(
                            "The ids of the memories to reward (from `retrieve` or `top_memories`)."))],
                        reward: Reward, source: Source = None, scope: Scope = None) -> CallToolResult:
        """Reward memories directly, by id, when there is no retrieval_id to reward (prefer `reward`)."""
        return server.result(lambda: service.reward([{"memory_ids": memory_ids, "reward": reward,
                                                      "alpha": alpha, "source": source}], scope))

    tools = [strict(retrieve, ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False),
                    RETRIEVE[read_only]),
             strict(top_memories, reads), strict(explain, reads), strict(stats, reads)]
    if not read_only:
        writes = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
        tools += [strict(remember, writes.model_copy(update={"idempotent_hint": True})),
                  strict(reward, writes.model_copy(update={"idempotent_hint": False})),
                  strict(reward_task, writes.model_copy(update={"idempotent_hint": False})),
                  strict(reward_memories, writes.model_copy(update={"idempotent_hint": False}))]
    server = MemoryServer(service, tools, read_only)
    return server


def serve(location: str, *, http: str | None = None, token: str | None = None, read_only: bool = False,
          selector: str = "memrl", alpha: float = DEFAULT_ALPHA, scope: str | None = None,
          bank_wait: float = BANK_WAIT) -> None:
    """Serve the bank at `location` over stdio, or over streamable HTTP at `http` ("HOST:PORT"); the
    retrieve tool selects with `selector` (memrl_cli.method.retrieval.SELECTORS), rewards learn at rate `alpha`;
    `scope` is the scope of calls that name none, `bank_wait` the seconds a call waits for a busy bank."""
    address = parse_address(http) if http is not None else None
    if address is not None:
        check_bind(address[0], token)
    check_wait(bank_wait)
    service = BankService(location, read_only, selector, scope=scope, busy_timeout=bank_wait)
    try:
        server = build_server(service, alpha)
        if address is None:
            server.run("stdio")
        else:
            app = TokenGate(server.streamable_http_app(host=address[0]), token, bearer=True)
            run_http(app, address[0], address[1], "MCP server (streamable HTTP at /mcp)")
    finally:
        service.close()
