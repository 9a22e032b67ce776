"""``python -m blade_codegen``: the same command as ``blade-codegen``."""

from blade_codegen.cli import main

main()
