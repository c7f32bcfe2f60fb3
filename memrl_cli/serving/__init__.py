"""A bank served to other programs: the learning operations both servers share (`service`), the
network rules (`network`), the MCP server (`mcp`) and the OpenAI-compatible proxy (`proxy`, with
which calls make one task, `proxy_tasks`, and where a receipt goes in an answer, `proxy_receipts`)."""
