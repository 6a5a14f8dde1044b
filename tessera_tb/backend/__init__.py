"""Analyses shared by the plugin, `tessera.analyze`, the CLI and the exporters."""
