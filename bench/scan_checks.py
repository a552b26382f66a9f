"""What the scan's content checks (issue 41) cost: strict, bounded JSON and a checkpoint's whole verdict.

A tokenizer the size of a large real one (``--vocab`` entries and as many merges, about 9 MB at the
default 150,000) is parsed by ``files.parse_json`` (no NaN, no key twice, at most 64 levels) against
plain ``json.loads`` of the same text, in this process; then the verdict of a ``save_pretrained`` folder
with that tokenizer (``layouts.inspect``: headers, config, sizes and the tokenizer) is timed against the
same folder without a tokenizer, which the scan judged before. The ratios say what the checks add to a
look at a complete checkpoint; a worker run they save costs minutes.

    python -m bench.scan_checks [--vocab 150000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from inference import layouts
from inference.layouts import files, take_snapshot


def tokenizer_text(vocab: int) -> str:
    """A byte-level BPE tokenizer's shape: a vocab map and a merges list, each ``vocab`` long."""
    words = [f"tok{i:06d}" for i in range(vocab)]
    return json.dumps(
        {
            "version": "1.0",
            "added_tokens": [{"id": 0, "content": "<s>", "special": True}],
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False},
            "model": {
                "type": "BPE",
                "dropout": None,
                "vocab": {word: i for i, word in enumerate(words)},
                "merges": [[words[i], words[i + 1]] for i in range(vocab - 1)],
            },
        }
    )


def best(call: Callable[[], object], repeat: int) -> float:
    """The fastest of ``repeat`` runs of ``call``, in seconds."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=150_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    text = tokenizer_text(args.vocab)
    plain = best(lambda: json.loads(text), args.repeat)
    strict = best(lambda: files.parse_json(text, "tokenizer.json"), args.repeat)
    print(f"tokenizer.json: {len(text) / 2**20:.1f} MiB")
    print(f"  json.loads        {plain * 1000:8.1f} ms")
    print(f"  files.parse_json  {strict * 1000:8.1f} ms   ratio {strict / plain:.2f}")

    from tests.checkpoints import save_tiny_llama

    with tempfile.TemporaryDirectory(prefix="evald-scan-") as tmp:
        bare = save_tiny_llama(Path(tmp) / "bare")
        full = save_tiny_llama(Path(tmp) / "full")
        (full / "tokenizer.json").write_text(text)

        def verdict(folder: Path) -> Callable[[], object]:
            return lambda: layouts.inspect(folder, take_snapshot(folder), "hf")

        assert verdict(full)() == layouts.Verdict.complete()
        without = best(verdict(bare), args.repeat)
        with_tokenizer = best(verdict(full), args.repeat)
    print("verdict of a complete save_pretrained folder (tiny weights):")
    print(f"  no tokenizer      {without * 1000:8.1f} ms")
    print(f"  with tokenizer    {with_tokenizer * 1000:8.1f} ms   ratio {with_tokenizer / without:.1f}")


if __name__ == "__main__":
    main()
