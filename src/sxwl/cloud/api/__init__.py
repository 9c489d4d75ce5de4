"""The HTTP API: REST v1 under /api/v1 (users, admins, providers, and the agents' protocol) and the
OpenAI-compatible fine-tuning API under /v1. Thin routers: each opens the request's unit of work
(``ctx.db.session()``) and calls the services, which hold the logic and the SQL."""
