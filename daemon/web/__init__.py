"""``evald serve``: the read-only HTTP service — JSON API under ``/api/v1/``, the dashboard, ``/metrics``.

Another front door onto :mod:`storage`, like the CLI: routes call the same query functions and render
their rows as JSON. The database is opened read-only (:class:`storage.database.Database` with
``read_only=True``), so no route can write, whatever its bug.
"""
