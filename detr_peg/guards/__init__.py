"""Rules that hold for every command, one mechanism per rule: see "Rules by class of input" in docs/guarantees.md."""
