"""The serving ring: the HTTP API and its approval inbox (``serving.http``), the MCP server
(``serving.mcp``), ``blade-runtime serve`` (``serving.serve``) and the operators' command line
(``serving.cli``). Each is an optional extra of the distribution."""
