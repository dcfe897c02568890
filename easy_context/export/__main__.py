"""``python -m easy_context.export MODEL_DIR --gguf OUT.gguf`` (also ``easy-context-export``)."""

from __future__ import annotations

import sys

from easy_context.export.cli import main

if __name__ == "__main__":
    sys.exit(main())
