"""The lab: studies over configs and seeds (``detr-peg study``, ``plot``), the benchmark (``detr-peg bench``)
and the data of the composite proxy. Tools around the detector, not on its path: the core never imports
this package (an import-linter contract); the command line names its commands by module path."""
