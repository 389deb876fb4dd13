"""Studies (``detr-peg study``): training runs over base configs x config values x seeds, evaluated and tabulated."""
