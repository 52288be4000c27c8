"""Writes tokenizer.json: a byte-level BPE without merges, so every byte of a prompt
is one token and distinct text has distinct token ids (unlike tokenizer-tiny's
word-level vocabulary), plus the chat template's special tokens.

Usage: python generate.py (needs the `tokenizers` package).
"""
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
tokenizer = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
tokenizer.decoder = decoders.ByteLevel()
tokenizer.add_special_tokens(["<s>", "<|user|>", "<|assistant|>", "<|system|>"])
tokenizer.save(str(Path(__file__).with_name("tokenizer.json")))
