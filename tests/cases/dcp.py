"""A model saved with ``torch.distributed.checkpoint.save`` (one process), torchtitan-style ``step-N``.

The real writer: ``__0_0.distcp`` first, then ``.metadata`` (written to ``.metadata.tmp`` and renamed).
The state dict nests the model under ``"model"`` beside a non-tensor entry, as training loops save it.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from tests.checkpoints import LayoutCase
from tests.toy_model import toy_model

CANDIDATE = "step-7"


def build(tmp: Path) -> LayoutCase:
    from torch.distributed.checkpoint.state_dict_saver import save

    model, tokenizer = toy_model(seed=7)
    hf_config = tmp / "hf_config"
    model.config.save_pretrained(hf_config)
    tokenizer.save_pretrained(hf_config)
    folder = tmp / "run" / CANDIDATE
    with warnings.catch_warnings():
        # "torch.distributed is disabled ... assuming the intent is to save in a single process": it is.
        warnings.simplefilter("ignore", UserWarning)
        save({"model": model.state_dict(), "step": 7}, checkpoint_id=str(folder))
    data = sorted(p.name for p in folder.iterdir() if p.name.endswith(".distcp"))
    order = (*(f"{CANDIDATE}/{name}" for name in data), f"{CANDIDATE}/.metadata")
    return LayoutCase(
        layout="dcp", source=tmp / "run", candidate=CANDIDATE, order=order, step=7, hf_config=hf_config
    )
