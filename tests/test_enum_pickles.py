"""Checkpoints a trainer wrote under Python 3.11.0 to 3.11.4, which pickle an enum member as
``getattr(EnumClass, "NAME")``: read as the same checkpoints written elsewhere, and ``getattr`` reads
nothing but an enum member by name.

The trainers here run on whatever Python the suite runs on; the pickling of those releases is put back
for the write (``Enum.__reduce_ex__`` as 3.11.2's ``enum.py`` has it), and each test first checks that the
file names ``builtins.getattr``, so that it tests what it says whichever Python runs it.
"""

from __future__ import annotations

import enum
import pickle
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from inference.errors import CheckpointInvalid
from inference.layouts import LayoutSettings, Readiness, get, take_snapshot
from inference.layouts.dcp import MetadataUnpickler, read_metadata
from inference.layouts.deepspeed import consolidated_state_dict
from tests.cases import dcp, deepspeed_zero1


def _by_name(self: enum.Enum, proto: int) -> tuple[object, tuple[type, str]]:
    """``Enum.__reduce_ex__`` of Python 3.11.0-3.11.4."""
    return getattr, (self.__class__, self._name_)


@pytest.fixture
def early_311(monkeypatch: pytest.MonkeyPatch) -> None:
    """Enum members pickled as Python 3.11.0-3.11.4 pickle them, while the test writes."""
    monkeypatch.setattr(enum.Enum, "__reduce_ex__", _by_name)


class Getattr:
    """Pickles as ``getattr(owner, name)``: what a crafted file may ask of ``builtins.getattr``."""

    def __init__(self, owner: type, name: str) -> None:
        self.owner, self.name = owner, name

    def __reduce__(self) -> tuple[object, tuple[type, str]]:
        return getattr, (self.owner, self.name)


def _names_getattr(data: bytes) -> bool:
    return b"getattr" in data


def test_dcp_metadata_written_so_is_complete_and_reads_as_written(early_311: None, tmp_path: Path) -> None:
    case = dcp.build(tmp_path)
    folder = case.source / case.candidate
    assert _names_getattr((folder / ".metadata").read_bytes())
    layout = get("dcp")
    verdict = layout.inspect(folder, take_snapshot(folder), LayoutSettings(hf_config=case.hf_config))
    assert (verdict.readiness, verdict.reason) == (Readiness.COMPLETE, "complete")
    with (folder / ".metadata").open("rb") as handle:
        assert read_metadata(folder / ".metadata") == pickle.load(handle)  # what plain pickle builds


def test_a_zero_checkpoint_written_so_consolidates_to_the_same_weights(
    early_311: None, tmp_path: Path
) -> None:
    case = deepspeed_zero1.build(tmp_path / "case")
    directory = case.source / case.candidate
    expected = consolidated_state_dict(directory)
    shards = sorted(directory.glob("*_optim_states.pt"))
    assert shards
    for shard in shards:
        # The writer's own file, which holds the ZeRO stage enum: rewritten as those releases write it.
        torch.save(torch.load(shard, weights_only=False), shard)
        assert _names_getattr(shard.read_bytes())
    consolidated = consolidated_state_dict(directory)
    assert consolidated.keys() == expected.keys()
    assert all(torch.equal(consolidated[name], expected[name]) for name in expected)


def test_getattr_for_anything_but_an_enum_member_fails_the_checkpoint(tmp_path: Path) -> None:
    case = deepspeed_zero1.build(tmp_path / "case")
    directory = case.source / case.candidate
    from deepspeed.runtime.zero.config import ZeroStageEnum

    shard = next(directory.glob("*_optim_states.pt"))
    state = torch.load(shard, weights_only=False)
    torch.save({**state, "sneaky": Getattr(ZeroStageEnum, "__class__")}, shard)
    with pytest.raises(CheckpointInvalid, match="is not an enum member by name"):
        consolidated_state_dict(directory)


def _metadata_classes() -> list[type]:
    import torch.distributed.checkpoint.metadata as metadata

    classes = [found for found in vars(metadata).values() if isinstance(found, type)]
    return [*classes, torch.Size, OrderedDict]


#: Names a crafted file may ask for: attributes that reach further, and real members of the enums.
NAMES = ("__class__", "__init__", "__subclasses__", "__members__", "mro", "TORCH_CONTIGUOUS_FORMAT")


@given(
    owner=st.sampled_from(_metadata_classes()),
    name=st.one_of(st.sampled_from(NAMES), st.text(max_size=30)),
    protocol=st.integers(0, pickle.HIGHEST_PROTOCOL),
)
def test_dcp_metadatas_getattr_gives_an_enum_member_or_refuses(owner: type, name: str, protocol: int) -> None:
    import io

    data = pickle.dumps(Getattr(owner, name), protocol=protocol)
    members = getattr(owner, "__members__", {}) if isinstance(owner, enum.EnumMeta) else {}
    if name in members:
        assert MetadataUnpickler(io.BytesIO(data)).load() is members[name]
    else:
        with pytest.raises(pickle.UnpicklingError):
            MetadataUnpickler(io.BytesIO(data)).load()


def test_every_member_of_dcps_enum_is_read_back_by_name() -> None:
    import io

    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    for member in _MEM_FORMAT_ENCODING:
        data = pickle.dumps(Getattr(_MEM_FORMAT_ENCODING, member.name))
        assert _names_getattr(data)
        assert MetadataUnpickler(io.BytesIO(data)).load() is member
