"""The command line's subcommands, one module each."""
