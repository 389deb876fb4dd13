"""The lab: studies, the benchmark and the composite proxy data; the core never imports it (import-linter contract)."""
