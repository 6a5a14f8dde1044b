"""`tessera-prof`: one module per subcommand, each with `prepare_parser` and `run`."""
