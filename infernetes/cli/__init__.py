"""The ``infernetes`` command line: one module per subcommand (see ``main.py``)."""
