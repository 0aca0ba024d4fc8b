"""A self-contained byte-level tokenizer for tiny random models (no download, deterministic).

Vocabulary: the 256 byte symbols of GPT-2's byte-level alphabet plus a few special tokens.
Every string round-trips exactly through encode/decode.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_byte_tokenizer() -> PreTrainedTokenizerFast:
    """A PreTrainedTokenizerFast over raw bytes; vocab size 256 + len(SPECIAL_TOKENS)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {sym: i for i, sym in enumerate(sorted(alphabet))}
    for tok in SPECIAL_TOKENS:
        vocab[tok] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(SPECIAL_TOKENS)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        bos_token=None,
        unk_token=None,
    )
    tok.chat_template = CHATML_TEMPLATE
    tok.padding_side = "left"
    return tok
