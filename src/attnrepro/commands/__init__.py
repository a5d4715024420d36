"""The command line: `attnrepro` (main) and its subcommands, each a module (audit, keep and
restore, kv, store, staging, tiny). The top of the house: imports any layer, imported by none."""
