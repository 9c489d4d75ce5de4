"""Inference endpoints (docs/endpoints.md): each replica a job of the endpoint kind, served through
the agents' tunnels."""
