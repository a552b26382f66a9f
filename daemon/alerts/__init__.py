"""Alerts: stored results judged into alerts that fire and resolve, their notices queued in the outbox
(:mod:`.lifecycle`; episodes, :mod:`.episodes`). :mod:`daemon.delivery` sends them."""
