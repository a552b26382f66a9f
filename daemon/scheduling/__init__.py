"""Deciding what to evaluate and when.

The planner (:mod:`.planner`) applies the pure rules (:mod:`.policy`, :mod:`.frequency`, :mod:`.adaptive`,
:mod:`.stages`), queues the jobs they decide on (:mod:`.enqueue`) and what a result sets off
(:mod:`.followups`); timers (:mod:`.timers`) and resource checks (:mod:`.resources`) beside it.
"""
