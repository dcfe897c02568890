"""``python -m easy_context.extend``: :func:`easy_context.extend.cli.main`."""

import sys

from easy_context.extend.cli import main

sys.exit(main())
