"""Reading what was stored: metric curves, smoothing, significance, charts and the tables every surface shows.

- ``curves``: result rows as one series per run, task, stage and metric; two runs compared point by point.
- ``significance``: the paired and independent tests and Benjamini–Hochberg (pure functions).
- ``smoothing``: EMA and moving-window smoothing of a series and its standard errors.
- ``run_rows``: one run's stored results, narrowed, as each analysis of a run starts from them.
- ``compare``: ``evald compare``'s two runs read from the database and compared.
- ``run_status``: every configured run's status read from the database (``evald status``).
- ``plot``: a metric's curves drawn as PNG, PDF or SVG.
- ``report``: rows as tables, JSON and CSV (results, status, history, samples, alerts, comparisons).
- ``repeats``: errors that come back pass after pass, logged once and then counted.
"""
