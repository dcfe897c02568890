"""``python -m easy_context.plan``: :func:`easy_context.plan.cli.main`."""

import sys

from easy_context.plan.cli import main

sys.exit(main())
