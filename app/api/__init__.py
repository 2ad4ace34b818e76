"""The HTTP shell: the app, the localhost guard, ops and admin routes, error mapping and
the shared intake; one package per foreign API beside them, each with its routes,
schemas and replies."""
