"""Executors: where a job's worker runs, behind one contract (:mod:`.base`): :mod:`.local` (worker
processes here) and :mod:`.slurm` (with :mod:`.slurm_script`, :mod:`.slurm_cli` and :mod:`.slurm_output`).
"""
