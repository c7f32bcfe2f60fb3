"""The harness: the loop, the adapter protocol, the registry, metrics, `memrl bench` and the LLM client."""
