"""blade_codegen: compile tool spec files into typed Python (models, interfaces, manifest)."""

__version__ = "0.1.0"
