"""blade_runtime: the types generated tool modules build on, and the runtime that runs them.

Generated code imports only this package, pydantic and the standard library, so a spec package's
users install neither the code generator nor its dependencies.
"""

from blade_runtime.caller import CallContext, Principal
from blade_runtime.context import (
    ActionRef,
    CallInfo,
    CancellationSignal,
    DataItem,
    Execution,
    InitialEntry,
    ResumeEntry,
    Suspended,
    SuspensionEpisode,
    ToolFailed,
)
from blade_runtime.events import ActionOrigin, PendingAction
from blade_runtime.execution import ChildToolError
from blade_runtime.export import ExportedTool, ExportFormat, ToolExport, WireNames, export_tools
from blade_runtime.hooks import HookEvent, HookInput, HookOutput
from blade_runtime.memory import MemoryStore
from blade_runtime.results import (
    ErrorCode,
    ToolError,
    ToolPending,
    ToolResult,
    ToolSkipped,
    ToolSuccess,
)
from blade_runtime.runtime import (
    FallbackCall,
    PermissionRequest,
    Registration,
    RegistrationError,
    Runtime,
)
from blade_runtime.spec import (
    BackendToolSpec,
    CapabilitySpec,
    ClientToolSpec,
    DataChannel,
    ExecutionMode,
    JsonObject,
    SideEffect,
    SuspendPoint,
    ToolKind,
    ToolSpec,
    load_schemas,
)
from blade_runtime.sqlite import SQLiteStore
from blade_runtime.store import Store, StoreError, StoreUnavailable
from blade_runtime.urls import open_store

__version__ = "0.1.0"

__all__ = [
    "ActionOrigin",
    "ActionRef",
    "BackendToolSpec",
    "CallContext",
    "CallInfo",
    "CancellationSignal",
    "CapabilitySpec",
    "ChildToolError",
    "ClientToolSpec",
    "DataChannel",
    "DataItem",
    "ErrorCode",
    "Execution",
    "ExecutionMode",
    "ExportFormat",
    "ExportedTool",
    "FallbackCall",
    "HookEvent",
    "HookInput",
    "HookOutput",
    "InitialEntry",
    "JsonObject",
    "MemoryStore",
    "PendingAction",
    "PermissionRequest",
    "Principal",
    "Registration",
    "RegistrationError",
    "ResumeEntry",
    "Runtime",
    "SQLiteStore",
    "SideEffect",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "SuspendPoint",
    "Suspended",
    "SuspensionEpisode",
    "ToolError",
    "ToolExport",
    "ToolFailed",
    "ToolKind",
    "ToolPending",
    "ToolResult",
    "ToolSkipped",
    "ToolSpec",
    "ToolSuccess",
    "WireNames",
    "__version__",
    "export_tools",
    "load_schemas",
    "open_store",
]
