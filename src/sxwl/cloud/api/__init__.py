"""The REST API: thin routers over the services (parse, call one service, shape the reply). Each
router module is named for its domain; ``agent/`` holds what CPods call and ``openai/`` the
OpenAI-compatible ``/v1``. Routers never touch HTTP-free rules themselves: those live in services."""
