"""The service's routes, one module per resource; each exposes ``routes() -> list[BaseRoute]``."""
