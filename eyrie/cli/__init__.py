"""The `eyrie` command: one entry, a module per subcommand group."""
