"""Studies: grids of training runs over base configs, config values and seeds, evaluated and tabulated.

:mod:`~detr_peg.lab.study.grid` defines a study and expands its cells,
:mod:`~detr_peg.lab.study.study_file` reads study files, :mod:`~detr_peg.lab.study.cell`
runs one cell, :mod:`~detr_peg.lab.study.runner` runs a study in this process,
:mod:`~detr_peg.lab.study.slurm` as submitit jobs, :mod:`~detr_peg.lab.study.results`
tabulates, :mod:`~detr_peg.lab.study.comparisons` compares each setting with the
reference setting seed by seed, :mod:`~detr_peg.lab.study.seed_rule` decides when
``--seeds auto`` has enough seeds, and :mod:`~detr_peg.lab.study.plots` draws. The command is ``detr-peg study``.
"""
