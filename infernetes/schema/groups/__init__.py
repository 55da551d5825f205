"""The server-argument table, one module per configuration group (see ``infernetes.schema.args``)."""
