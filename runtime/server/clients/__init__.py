"""What the client subcommands (chat, complete, run-batch) run, behind their light CLI modules."""
