"""workbench: activation capture, topology and polysemanticity analysis of transformer LMs.

Heavy imports (torch, transformer_lens) are kept out of this module so that
``workbench --help`` and ``import workbench`` stay fast.
"""

from workbench.errors import WorkbenchError

__all__ = ["WorkbenchError", "__version__"]
__version__ = "0.1.0"
