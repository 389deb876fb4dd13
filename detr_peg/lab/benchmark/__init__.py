"""Speed, memory and FLOP benchmarks (``detr-peg bench``)."""
