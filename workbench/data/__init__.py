"""Text and prompt data. Submodules may import heavy packages; this file stays light."""
