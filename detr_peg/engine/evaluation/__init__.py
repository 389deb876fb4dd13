"""COCO evaluation: the metrics, a model over a sharded loader, and the ``eval`` command's runs.

Modules: ``coco_metrics``, ``evaluate``, ``run``, ``scales`` (``--scales``), ``padding`` (``--padding``).
"""
