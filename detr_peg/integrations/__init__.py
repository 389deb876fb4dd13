"""Integrations of detr_peg with other frameworks, each in its own subpackage.

The core package never imports these; each subpackage imports the core and
its framework, and raises one clear ``ImportError`` when the framework is
missing (:mod:`detr_peg.integrations.detectron2`).
"""
