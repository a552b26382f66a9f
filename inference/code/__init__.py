"""Code tasks (``kind = "code"``): problems with tests, the model's code run against them in a sandbox.

Modules, from the edge in:

- :mod:`~inference.code.problems` reads the two dataset formats (assert tests, stdin/stdout cases);
- :mod:`~inference.code.extract` takes the code out of a response (pure);
- :mod:`~inference.code.sandbox` runs one command in bubblewrap (or, when configured, bare) with rlimits
  and a wall clock, and leaves no process behind; :mod:`~inference.code.status` reads bwrap's own status;
- :mod:`~inference.code.runners` turns code and a test into files and a command, per language (Python's
  assert tests run under :mod:`~inference.code.runners.python_harness`, in the sandbox);
- :mod:`~inference.code.grading` turns an execution into a verdict (pure);
- :mod:`~inference.code.judge` runs a job's samples in parallel and collects their verdicts;
- :mod:`~inference.code.stream` judges each batch's samples while the next batches generate;
- :mod:`~inference.code.harness` runs lm-eval's ``code_eval`` (humaneval, mbpp) in the same sandbox.
"""
