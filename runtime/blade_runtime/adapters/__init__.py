"""Adapters from a runtime to agent frameworks, each an optional extra imported only when used:
``blade_runtime.adapters.pydantic_ai`` (``[pydantic-ai]``), ``.openai_agents``
(``[openai-agents]``) and ``.langgraph`` (``[langgraph]``).

Each keeps what makes the runtime's tools different across the crossing: the spec's JSON Schema
is the tool's schema and the runtime validates every input and output against it (the framework
coerces nothing), a suspension is the framework's own notion of a call that waits, and a resume
goes through ``runtime.submit`` (validated first; exactly one of concurrent resumes wins)."""
