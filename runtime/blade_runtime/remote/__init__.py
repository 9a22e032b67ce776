"""Remote MCP servers' tools as typed, durable tools of a runtime (the ``mcp`` extra).

    bridge = await connect_mcp(runtime, McpServer.stdio("files", "files-server"), prefix="fs_")

See ``bridge`` for the dynamic and typed bindings, ``servers`` for the connection, and
``docs/mcp-bridge.md``. The MCP SDK is imported only when a connection opens.
"""

from blade_runtime.remote.bridge import McpBridge, RemoteArguments, RemoteTool, connect_mcp
from blade_runtime.remote.servers import McpServer, ServerUnavailable

__all__ = [
    "McpBridge",
    "McpServer",
    "RemoteArguments",
    "RemoteTool",
    "ServerUnavailable",
    "connect_mcp",
]
