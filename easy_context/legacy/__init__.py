"""EasyContext compatibility, in one place: its per-backend names (:mod:`.names`) and its module paths
(:mod:`.paths`). Only ``easy_context/__init__.py`` imports this package; nothing else uses compatibility code."""
