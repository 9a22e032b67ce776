"""blade_runtime: the types generated tool modules build on, and the runtime that runs them.

Generated code imports only this package, pydantic and the standard library, so a spec package's
users install neither the code generator nor its dependencies.
"""

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
from blade_runtime.spec import (
    BackendToolSpec,
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

__version__ = "0.1.0"

__all__ = [
    "ActionRef",
    "BackendToolSpec",
    "CallInfo",
    "CancellationSignal",
    "ClientToolSpec",
    "DataChannel",
    "DataItem",
    "Execution",
    "ExecutionMode",
    "InitialEntry",
    "JsonObject",
    "ResumeEntry",
    "SideEffect",
    "SuspendPoint",
    "Suspended",
    "SuspensionEpisode",
    "ToolFailed",
    "ToolKind",
    "ToolSpec",
    "__version__",
    "load_schemas",
]
