"""Rules that hold for every command, whatever the input: one mechanism per rule.

* :mod:`~detr_peg.fileio.bounded_read`: every file detr_peg reads (config
  YAML, COCO JSON, checkpoints, images) is a regular file of bounded size,
  and parsed data is bounded in nesting depth, node count and integer range;
* :mod:`~detr_peg.guards.output_guard`: a command never writes to one of its
  inputs, nor over a file that detr_peg did not write; what each command
  reads and writes is declared in :mod:`~detr_peg.guards.declared_io`;
* :mod:`~detr_peg.checkpoint.weights_check`: weights are floating point and
  finite when loaded and saved, and model outputs are finite before any
  metric is computed from them;
* :mod:`~detr_peg.guards.resume_rules`: which changed settings a resumed run
  accepts, and which it refuses because the saved position would mean
  something else.
"""
