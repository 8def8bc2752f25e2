"""One module per subcommand, each with `HELP`, `prepare_parser(parser)` and `run(args)`."""
