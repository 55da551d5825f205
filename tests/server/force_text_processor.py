"""A test-only ``--logits-processors`` class: makes the tiny random model write a given text, so
a tool call in a parser's own format is well-formed.

A request with ``vllm_xargs`` ``{"force_text": TEXT}`` writes exactly TEXT, then the end of text,
unless its prompt already holds ``unless_prompt_has`` (the turn after a tool's answer, which is
the model's own); ``{"force_ids": [...]}`` writes those token ids (a tokenizer other than the
folder's Hugging Face one). Rows of other requests are left alone."""

from __future__ import annotations

from transformers import AutoTokenizer


class ForceText:
    def __init__(self, vllm_config, device, is_pin_memory):
        self.tokenizer = AutoTokenizer.from_pretrained(str(vllm_config.model.info.path))
        self.eos = self.tokenizer.eos_token_id
        self.forced: dict[int, tuple[list[int], object]] = {}  # row -> (text's ids, output ids)

    def is_argmax_invariant(self) -> bool:
        return False

    def _target(self, params, prompt_ids) -> list[int] | None:
        args = params.extra_args or {}
        if args.get("force_ids"):  # token ids as given, special ones too (its own EOS last)
            return [int(i) for i in args["force_ids"]]
        text, unless = args.get("force_text"), args.get("unless_prompt_has")
        if not text or (unless and unless in self.tokenizer.decode(prompt_ids or [])):
            return None
        return self.tokenizer.encode(text, add_special_tokens=False)

    def update_state(self, batch_update) -> None:
        if batch_update is None:
            return
        for row in batch_update.removed:
            self.forced.pop(row, None)
        for row, params, prompt_ids, output_ids in batch_update.added:
            target = self._target(params, prompt_ids)
            self.forced.pop(row, None)
            if target is not None:
                self.forced[row] = (target, output_ids)
        for a, b, _ in batch_update.moved:  # only one-way moves are made
            moved = self.forced.pop(a, None)
            self.forced.pop(b, None)
            if moved is not None:
                self.forced[b] = moved

    def apply(self, logits):
        for row, (target, output_ids) in self.forced.items():
            at = len(output_ids)
            logits[row] = float("-inf")
            logits[row, target[at] if at < len(target) else self.eos] = 0.0
        return logits
