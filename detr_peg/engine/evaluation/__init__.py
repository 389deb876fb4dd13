"""COCO evaluation: the metrics, a model over a data loader, and the evaluation commands' runs.

* :mod:`~detr_peg.engine.evaluation.coco_metrics`: detections in the COCO
  results format, ``COCOeval`` and the metrics table (no model involved);
* :mod:`~detr_peg.engine.evaluation.evaluate`: a model over a (sharded)
  loader through the one inference loop, gathered for ``COCOeval``;
* :mod:`~detr_peg.engine.evaluation.run`: ``detr-peg eval``, a checkpoint in,
  ``metrics.json`` and ``detections.json`` out (also the evaluation during training);
* :mod:`~detr_peg.engine.evaluation.scales`: ``eval --scales/--canvas-scales``,
  the same model at several test sizes;
* :mod:`~detr_peg.engine.evaluation.padding`: ``eval --padding``, the same set
  one image at a time, in mixed batches and in equal-size batches.
"""
