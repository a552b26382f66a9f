"""lm-evaluation-harness tasks inside evald (``kind = "lm_eval"``).

- :mod:`.names`: lm-eval's metric keys (``exact_match,strict-match``) as evald metric names, and back.
- :mod:`.catalog`: which task names lm-eval knows, checked when the config is loaded.
- :mod:`.report`: lm-eval's results and per-sample logs as evald metrics and samples (plain data).
- :mod:`.evaluation`: the worker side: ``simple_evaluate`` on an ``HFLM`` around the model evald loaded.
- :mod:`.model`: that ``HFLM`` as one rank of a tp × dp worker group (lm-eval's rank = the replica).

Only :mod:`.evaluation`, :mod:`.model` and :mod:`.catalog` import ``lm_eval`` (and only when called; the
first imports the second when it runs): the rest is plain Python, so the daemon and the metric registry
use it for free.
"""
