"""Stands in for transformers' ``tests/exporters/test_export.py`` (not in the sdist): no ``torch.export`` tests.

Exporting traces the model (seconds per family on CPU) and says nothing about which attention function runs.
"""


class ExportTesterMixin:
    pass
