"""The HTTP API: create_app(settings), routes, auth, problem+json."""
