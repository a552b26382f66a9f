"""A toy training run for demos and tests: a tiny Llama learning two-digit addition on a CPU.

- :mod:`inference.toy.tokenizer`: a character-level Hugging Face tokenizer built offline.
- :mod:`inference.toy.problems`: the problems, the train/held-out split, the prompt template, and
  ``python -m inference.toy.problems`` to write a held-out evaluation set.
- :mod:`inference.toy.trainer`: ``python -m inference.toy.trainer`` trains and saves checkpoints the way
  a real trainer does, so the daemon can be watched evaluating them as they appear.
"""
