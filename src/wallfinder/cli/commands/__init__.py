"""One module per subcommand, each with `prepare_parser(parser)` and `run(args)`; their
one-line helps are `wallfinder.cli.COMMANDS`."""
