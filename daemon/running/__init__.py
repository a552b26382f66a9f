"""Running jobs: claiming them, handing each to an executor, following it, and recording its end.

The entry point is :class:`daemon.running.runner.JobRunner`; each of its parts is one module here:

- :mod:`.attempt`: one worker run's stages and moves, and what its end becomes (pure);
- :mod:`.job_queue`: whether and what to claim (capacity, resources, room), and the job's spec;
- :mod:`.dispatch`: hand an attempt to its executor, poll it, time it out, re-attach to it;
- :mod:`.executor_watch`: the executor new claims go to, and whether it takes them now;
- :mod:`.lease`: heartbeats, and a claim lost to another daemon (fencing);
- :mod:`.recording`: a result stored, a job failed, retried or requeued, each run's history row;
- :mod:`.executors`: where a worker runs (``local``, ``slurm``), behind one contract;
- :mod:`.workers` and :mod:`.remote`: what a worker's files and a scheduler's end say;
  :mod:`.environment`: what a worker inherits.
"""
