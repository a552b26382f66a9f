"""A character-level tokenizer for the toy model, built offline.

Every character is one token, so the toy model reads ``23+45=`` digit by digit, which is what makes
arithmetic learnable by a tiny model in seconds. The vocabulary is printable ASCII plus newline;
any other character maps to ``<unk>`` (so only text over this alphabet round-trips exactly).
The tokenizer saves and loads like any Hugging Face tokenizer: ``AutoTokenizer.from_pretrained(dir)``
reads it back from ``tokenizer.json`` with no network.
"""

from __future__ import annotations

import string
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)

#: Printable ASCII without the whitespace controls, then space and newline: 97 characters.
ALPHABET = tuple(dict.fromkeys(string.digits + string.ascii_letters + string.punctuation + " \n"))


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Build the tokenizer; ``encode`` prepends ``<s>``, generation stops at ``</s>``."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate((*SPECIAL_TOKENS, *ALPHABET))}
    backend = Tokenizer(WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # "[\s\S]" rather than ".": a newline is a character like any other.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    # Fuse joins the characters back without the spaces a word-level decoder would insert.
    backend.decoder = decoders.Fuse()
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, vocab[BOS_TOKEN])],
    )
    # transformers leaves this constructor unannotated.
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        model_max_length=64,
    )
