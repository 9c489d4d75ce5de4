"""REST API v1: thin routers over the services."""
