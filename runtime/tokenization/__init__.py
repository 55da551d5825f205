"""Tokenizer loading and incremental detokenization."""
