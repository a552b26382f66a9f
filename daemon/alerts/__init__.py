"""Alerts: signing webhook requests (:mod:`.signing`), rendering alert payloads (:mod:`.payload`) and a
loopback webhook receiver for tests and the demo (:mod:`.receiver`)."""
