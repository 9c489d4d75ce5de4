"""The ``sxwl`` command: cloud server, demo, and the user/admin CLI."""
