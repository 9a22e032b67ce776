"""blade_runtime: the types generated tool modules build on, and the runtime that runs them.

Generated code imports only this package, pydantic and the standard library, so a spec package's
users install neither the code generator nor its dependencies.
"""

from typing import TYPE_CHECKING, Any

from blade_runtime.core.behavior import Behavior
from blade_runtime.core.caller import CallContext, Principal
from blade_runtime.core.capabilities import Binding, CapabilityUse, shared
from blade_runtime.core.content import Audio, EmbeddedResource, Image, Projected, ResourceLink, Text
from blade_runtime.core.context import (
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
from blade_runtime.core.effects import Effect, EffectRejected
from blade_runtime.core.events import ActionOrigin, PendingAction
from blade_runtime.core.execution import ChildToolError
from blade_runtime.core.export import (
    ExportedTool,
    ExportFormat,
    ToolExport,
    WireNames,
    export_tools,
)
from blade_runtime.core.fencing import Lease, LeaseNotHeld
from blade_runtime.core.files import (
    FileBody,
    FileRejected,
    FolderFiles,
    SavedFile,
    UnknownFile,
)
from blade_runtime.core.hooks import HookCallback, HookEvent, HookInput, HookOutput
from blade_runtime.core.permissions import (
    Allow,
    Ask,
    Decision,
    Deny,
    PermissionAnswer,
    PermissionPrompt,
    Policy,
    by_kind,
)
from blade_runtime.core.registry import Child, Trust
from blade_runtime.core.results import (
    ErrorCode,
    ToolError,
    ToolPending,
    ToolResult,
    ToolSkipped,
    ToolSuccess,
)
from blade_runtime.core.retention import Retention
from blade_runtime.core.sources import SourcePolicy
from blade_runtime.core.spec import (
    BackendToolSpec,
    CapabilitySpec,
    ClientToolSpec,
    DataChannel,
    EffectsSpec,
    ExecutionMode,
    JsonObject,
    SideEffect,
    SuspendPoint,
    ToolKind,
    ToolSpec,
    load_schemas,
)
from blade_runtime.core.store import Pruned, Store, StoreError, StoreUnavailable
from blade_runtime.core.triggers import Trigger, TriggerRejected
from blade_runtime.runtime import (
    CloseReport,
    FallbackCall,
    PermissionRequest,
    Registration,
    RegistrationError,
    Runtime,
)

if TYPE_CHECKING:
    from blade_runtime.stores.memory import MemoryStore
    from blade_runtime.stores.sqlite import SQLiteStore
    from blade_runtime.stores.urls import open_store

__version__ = "0.1.0"

# The stores are imported when first named, so that importing a generated package (which imports
# this one) opens no database driver and registers no fork hook (every store is SQL, memory's too).
_LAZY = {
    "MemoryStore": "blade_runtime.stores.memory",
    "SQLiteStore": "blade_runtime.stores.sqlite",
    "open_store": "blade_runtime.stores.urls",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'blade_runtime' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "ActionOrigin",
    "ActionRef",
    "Allow",
    "Ask",
    "Audio",
    "BackendToolSpec",
    "Behavior",
    "Binding",
    "CallContext",
    "CallInfo",
    "CancellationSignal",
    "CapabilitySpec",
    "CapabilityUse",
    "Child",
    "ChildToolError",
    "ClientToolSpec",
    "CloseReport",
    "DataChannel",
    "DataItem",
    "Decision",
    "Deny",
    "Effect",
    "EffectRejected",
    "EffectsSpec",
    "EmbeddedResource",
    "ErrorCode",
    "Execution",
    "ExecutionMode",
    "ExportFormat",
    "ExportedTool",
    "FallbackCall",
    "FileBody",
    "FileRejected",
    "FolderFiles",
    "HookCallback",
    "HookEvent",
    "HookInput",
    "HookOutput",
    "Image",
    "InitialEntry",
    "JsonObject",
    "Lease",
    "LeaseNotHeld",
    "MemoryStore",
    "PendingAction",
    "PermissionAnswer",
    "PermissionPrompt",
    "PermissionRequest",
    "Policy",
    "Principal",
    "Projected",
    "Pruned",
    "Registration",
    "RegistrationError",
    "ResourceLink",
    "ResumeEntry",
    "Retention",
    "Runtime",
    "SQLiteStore",
    "SavedFile",
    "SideEffect",
    "SourcePolicy",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "SuspendPoint",
    "Suspended",
    "SuspensionEpisode",
    "Text",
    "ToolError",
    "ToolExport",
    "ToolFailed",
    "ToolKind",
    "ToolPending",
    "ToolResult",
    "ToolSkipped",
    "ToolSpec",
    "ToolSuccess",
    "Trigger",
    "TriggerRejected",
    "Trust",
    "UnknownFile",
    "WireNames",
    "__version__",
    "by_kind",
    "export_tools",
    "load_schemas",
    "open_store",
    "shared",
]
