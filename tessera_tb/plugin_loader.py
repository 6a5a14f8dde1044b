"""TensorBoard's entry point for the Tessera Profiler tab (group `tensorboard_plugins`).

TensorBoard imports every registered loader at start-up, before it knows whether a plugin
has data. This module therefore imports nothing heavy: numpy, pandas and the plugin itself
are imported in `load()`, once TensorBoard builds its plugins.
"""

from __future__ import annotations

from tensorboard.plugins import base_plugin


class TesseraLoader(base_plugin.TBLoader):
    """Builds the Tessera plugin; `--tessera_refresh_s` sets how often runs are rediscovered."""

    def define_flags(self, parser) -> None:
        group = parser.add_argument_group("tessera")
        group.add_argument(
            "--tessera_refresh_s",
            type=float,
            default=5.0,
            help="Seconds between rescans of the logdir for new Tessera runs and steps "
            "(default 5). Requests never wait for a rescan.",
        )

    def load(self, context):
        from tessera_tb.backend.plugin import TesseraPlugin

        return TesseraPlugin(context)


# TensorBoard's documentation calls the loader a TBLoader; the entry point names this alias.
TBLoader = TesseraLoader
