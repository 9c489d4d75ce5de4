"""The ASGI edge: what every request passes through before and after a router (request ids and
access logs, the head deadline, body rules, error rendering, the long-polls' keep-alives). Knows no
domain: imports only errors, config and kit."""
