"""The server-rendered web console."""
