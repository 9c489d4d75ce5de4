"""The tunnel's framing, shared by the agent and the cloud: HTTP/2 (the ``h2`` library) carried in
the binary messages of one WebSocket the agent dials (docs/tunnel.md)."""
