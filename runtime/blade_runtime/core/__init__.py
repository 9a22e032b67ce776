"""The core ring: specs, the registry, the call runner, results, hooks, permissions, observers,
pending actions, recovery and the ``Store`` protocol the stores implement.

It depends on pydantic and jsonschema-rs only, and imports no other ring of the runtime:
stores, serving, adapters and clients build on it (``tests/runtime/test_import_contract.py``).
"""
