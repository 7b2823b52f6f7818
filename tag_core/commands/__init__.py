"""One module per `tag` subcommand; each defines `register(subparsers)` and sets `run`."""
