"""Delivery: the outbox sent to its sinks, webhooks and trackers (MLflow, W&B, TensorBoard), by one relay.

:mod:`.relay` is the machine (claim under a lease, deliver in batches, back off, pause, record every
attempt); :mod:`.base` the sink contract; :mod:`.sinks` one file per sink, with :mod:`.memory` their
in-memory twin; :mod:`.trackers` a ``[[trackers]]`` table's route. What is queued: an alert's notice
(:mod:`.alert_notice`, rendered for webhooks by :mod:`.payload`, signed by :mod:`.signing`) and a tracker's
messages (:mod:`.messages`, queued by :mod:`.tracker_queue`, backfilled by :mod:`.backfill`, reported by
:mod:`.report`). :mod:`.receiver` is a real webhook receiver on loopback, for tests and the demo.
"""
