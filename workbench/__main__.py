"""``python -m workbench``: the same command line as the ``workbench`` console script."""

from workbench.cli import main

main()
