"""Integrations with other frameworks, one subpackage each; the core never imports them."""
