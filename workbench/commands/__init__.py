"""Commands: the only modules that load a model by name, read user files and write result folders.

``workbench.cli``, the study runner and the app call them; the library packages below never import
them (``make test`` checks the layers with import-linter, see ARCHITECTURE.md). Each command checks every
argument before it writes anything, so a refused run leaves no trace.
"""
