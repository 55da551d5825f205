"""Tiny models for tests and the demo: random weights in safetensors plus a tokenizer trained here.

Nothing is downloaded. A byte-level BPE tokenizer is trained in about a second on a small built-in
corpus and saved as a Hugging Face ``PreTrainedTokenizerFast`` directory with a chat template; the
model is built from a transformers config with a fixed seed and saved with ``save_pretrained``, so
every call with the same arguments writes the same files.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infernetes.runtime.engine.stats import PROMPT_TOKEN_SOURCES

_CORPUS = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Kubernetes schedules pods onto nodes; each pod runs one or more containers that share a network.
Large language models predict the next token from the tokens that came before it.
The cache keeps keys and values of earlier tokens so that decoding does not recompute them.
Continuous batching lets new requests join a running batch at every step of the engine.
Paged attention stores the cache in fixed-size blocks, like pages of virtual memory.
She sells sea shells by the sea shore, and the shells she sells are surely sea shells.
In the beginning there was a server, and the server answered every request it was given.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159 and symbols like {"key": [1, 2, 3]} or a+b=c.
Unicode text: café, naïve, jalapeño, Grüße, 日本語, 中文, emoji 🙂 and 🚀 must survive decoding.
def add(a, b):\n    return a + b\n\nclass Engine:\n    def step(self):\n        pass
Hello! How are you today? I am fine, thank you. What is the capital of France? Paris is.
"""

# Prompts of different lengths for tests and examples.
SAMPLE_PROMPTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog and then it runs into the forest",
    "A",
    "Kubernetes schedules pods onto nodes; each pod runs containers that share a network.",
]

SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer(
    directory: str | Path,
    vocab_size: int = 512,
    add_bos: bool = True,
    extra_special_tokens: Sequence[str] = (),
    chat_template: str = CHAT_TEMPLATE,
) -> Any:
    """Train a byte-level BPE tokenizer and save it to ``directory``; returns the HF tokenizer.
    ``extra_special_tokens`` (a vision model's ``<image>``) are single tokens never split."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[*SPECIAL_TOKENS, *extra_special_tokens],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS.splitlines() * 4, trainer=trainer)
    if add_bos:
        bos_id = tokenizer.token_to_id("<s>")
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
        )
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>", *extra_special_tokens],
        chat_template=chat_template,
    )
    hf_tokenizer.save_pretrained(str(directory))
    return hf_tokenizer


QWEN_EXPERTS: dict[str, Any] = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)

# Families made from their transformers config class: the class, and what makes each family's
# tiny model exercise its own differences (multipliers, partial rotary, biases, caps, sinks).
# The transformers fallback is tested on all of them (native or not).
FAMILY_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "GraniteForCausalLM": (
        "GraniteConfig",
        dict(
            embedding_multiplier=2.0,
            residual_multiplier=0.5,
            attention_multiplier=0.2,
            logits_scaling=4.0,
        ),
    ),
    "Olmo2ForCausalLM": ("Olmo2Config", {}),
    "Starcoder2ForCausalLM": ("Starcoder2Config", dict(sliding_window=None, use_bias=True)),
    "Phi3ForCausalLM": ("Phi3Config", dict(partial_rotary_factor=0.5)),
    "GemmaForCausalLM": ("GemmaConfig", dict(head_dim=16)),
    # soft-capped attention and final logits, caps small enough to bite on a tiny model
    "Gemma2ForCausalLM": (
        "Gemma2Config",
        dict(
            head_dim=16,
            sliding_window=256,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=1.5,
        ),
    ),
    # attention sinks, alternating sliding/full layers, MoE experts with biases (unquantised)
    "GptOssForCausalLM": (
        "GptOssConfig",
        dict(
            head_dim=16,
            num_local_experts=4,
            num_experts_per_tok=2,
            intermediate_size=32,
            sliding_window=256,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    ),
    # local (sliding) and global layers with their own rope bases
    "Gemma3ForCausalLM": (
        "Gemma3TextConfig",
        dict(head_dim=16, sliding_window=256, query_pre_attn_scalar=24, rope_local_base_freq=100.0),
    ),
}


def _tiny_config(
    architecture: str, tokenizer_size: int, special: dict[str, int], **overrides: Any
) -> Any:
    """A transformers config for ``architecture`` small enough to run in milliseconds."""
    import transformers

    bos, eos, pad = special["bos"], special["eos"], special["pad"]
    common: dict[str, Any] = dict(
        vocab_size=tokenizer_size, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad
    )
    # A larger vocabulary than the tokenizer's is allowed (benchmarks feed token ids directly).
    common.update({key: overrides.pop(key) for key in list(overrides) if key in common})
    decoder: dict[str, Any] = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        initializer_range=0.1,
    )
    decoder.update(overrides)
    config: transformers.PretrainedConfig
    if architecture == "LlamaForCausalLM":
        config = transformers.LlamaConfig(**common, **decoder)
    elif architecture == "MistralForCausalLM":
        config = transformers.MistralConfig(**common, **{"sliding_window": None, **decoder})
    elif architecture == "Qwen2ForCausalLM":
        config = transformers.Qwen2Config(**common, **{**decoder, "tie_word_embeddings": True})
    elif architecture == "Qwen3ForCausalLM":
        config = transformers.Qwen3Config(**common, **{"head_dim": 32, **decoder})
    elif architecture == "Qwen2MoeForCausalLM":  # layer 1 dense, as mlp_only_layers allows
        config = transformers.Qwen2MoeConfig(
            **common,
            **{
                **decoder,
                **QWEN_EXPERTS,
                "shared_expert_intermediate_size": 48,
                "mlp_only_layers": [1],
                **overrides,
            },
        )
    elif architecture == "Qwen3MoeForCausalLM":
        config = transformers.Qwen3MoeConfig(
            **common,
            **{**decoder, **QWEN_EXPERTS, "head_dim": 32, "norm_topk_prob": True, **overrides},
        )
    elif architecture == "MixtralForCausalLM":
        experts = dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32)
        config = transformers.MixtralConfig(
            **common, **{"sliding_window": None, **decoder, **experts}
        )
    elif architecture in ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"):
        # MLA with small ranks, layer 0 dense, DeepSeek's routing with a scaling factor; V2 as
        # V2-Lite (no query compression, greedy softmax routing), V3 with grouped sigmoid routing
        latent = dict(
            kv_lora_rank=32,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=24,
            n_routed_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            n_shared_experts=1,
            first_k_dense_replace=1,
            routed_scaling_factor=2.5,
        )
        variant: dict[str, Any] = (
            dict(q_lora_rank=None)
            if architecture == "DeepseekV2ForCausalLM"
            else dict(q_lora_rank=24, n_group=4, topk_group=2, norm_topk_prob=True)
        )
        deepseek_config = getattr(transformers, architecture.replace("ForCausalLM", "Config"))
        config = deepseek_config(
            **common, **{**decoder, "num_key_value_heads": 4, **latent, **variant, **overrides}
        )
    elif architecture in FAMILY_CONFIGS:
        config_class, extra = FAMILY_CONFIGS[architecture]
        config = getattr(transformers, config_class)(**common, **{**decoder, **extra, **overrides})
    elif architecture == "OPTForCausalLM":
        config = transformers.OPTConfig(
            **common,
            hidden_size=64,
            ffn_dim=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=512,
            word_embed_proj_dim=64,
            init_std=0.1,
        )
    elif architecture == "GPT2LMHeadModel":
        config = transformers.GPT2Config(
            **common, n_embd=64, n_layer=2, n_head=4, n_positions=512, initializer_range=0.1
        )
    elif architecture == "BertModel":
        config = transformers.BertConfig(
            **common,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=512,
            initializer_range=0.1,
        )
    else:
        raise ValueError(f"no tiny config for architecture {architecture!r}")
    if architecture in ("OPTForCausalLM", "GPT2LMHeadModel", "BertModel"):
        for key, value in overrides.items():
            setattr(config, key, value)
    config.architectures = [architecture]
    return config


def make_tiny_model(
    directory: str | Path,
    architecture: str = "LlamaForCausalLM",
    *,
    seed: int = 0,
    dtype: str = "float32",
    max_shard_size: str | None = None,
    generation_config: dict[str, Any] | None = None,
    **config_overrides: Any,
) -> Path:
    """Write a tiny random ``architecture`` model with a trained tokenizer into ``directory``.

    ``config_overrides`` are set on the transformers config (e.g. ``rope_parameters``);
    ``max_shard_size`` (e.g. ``"20KB"``) splits the safetensors into shards with an index file;
    ``generation_config`` writes a ``generation_config.json`` with those fields.
    """
    import torch
    import transformers

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(directory, add_bos=architecture != "BertModel")
    special = {
        "bos": tokenizer.bos_token_id,
        "eos": tokenizer.eos_token_id,
        "pad": tokenizer.pad_token_id,
    }
    config = _tiny_config(architecture, len(tokenizer), special, **config_overrides)
    config.dtype = dtype
    torch.manual_seed(seed)
    model_class = getattr(transformers, architecture)
    model = model_class(config).to(getattr(torch, dtype)).eval()
    for name, buffer in model.named_buffers():
        if name.endswith("e_score_correction_bias"):  # zero at init: make it choose experts
            buffer.copy_(torch.rand_like(buffer) * 0.5)
    kwargs: dict[str, Any] = {}
    if max_shard_size is not None:
        kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(str(directory), **kwargs)
    generation_path = directory / "generation_config.json"
    if generation_config is not None:
        fields = {
            "bos_token_id": special["bos"],
            "eos_token_id": special["eos"],
            **generation_config,
        }
        generation_path.write_text(json.dumps(fields, indent=2))
    elif generation_path.exists():
        generation_path.unlink()
    return directory


def make_tiny_llama(directory: str | Path, **kwargs: Any) -> Path:
    """The default tiny model: a Llama with GQA, used by most engine tests and the demo."""
    return make_tiny_model(directory, "LlamaForCausalLM", **kwargs)


def make_tiny_eagle(directory: str | Path, target: str | Path, seed: int = 0) -> Path:
    """A random EAGLE-1 head for the tiny Llama at ``target``, in the published layout (as
    yuhuili/EAGLE-LLaMA3-Instruct-8B is laid out): a one-layer LlamaForCausalLM config.json of
    the target's widths and ``fc.weight``, ``layers.0.*`` (no input norm) and a copy of the
    embedding in model.safetensors."""
    import torch
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = json.loads((Path(target) / "config.json").read_text())
    config.update(num_hidden_layers=1, architectures=["LlamaForCausalLM"])
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    head_dim = hidden // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim
    shapes = {
        "fc.weight": (hidden, 2 * hidden),
        "embed_tokens.weight": (config["vocab_size"], hidden),
        "layers.0.self_attn.q_proj.weight": (hidden, hidden),
        "layers.0.self_attn.k_proj.weight": (kv, hidden),
        "layers.0.self_attn.v_proj.weight": (kv, hidden),
        "layers.0.self_attn.o_proj.weight": (hidden, hidden),
        "layers.0.mlp.gate_proj.weight": (inner, hidden),
        "layers.0.mlp.up_proj.weight": (inner, hidden),
        "layers.0.mlp.down_proj.weight": (hidden, inner),
    }
    generator = torch.Generator().manual_seed(seed)
    tensors = {
        name: torch.randn(shape, generator=generator) * 0.1 for name, shape in shapes.items()
    }
    tensors["layers.0.post_attention_layernorm.weight"] = torch.ones(hidden)
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def make_tiny_eagle3(
    directory: str | Path, target: str | Path, draft_vocab_size: int = 256, seed: int = 0
) -> Path:
    """A random EAGLE-3 head for the tiny Llama at ``target``, in the published layout (as
    yuhuili/EAGLE3-LLaMA3.1-Instruct-8B is laid out): ``fc`` over three of the target's hidden
    states, ``midlayer.*`` (its QKV projection twice as wide, ``hidden_norm``), ``norm``, an
    ``lm_head`` over ``draft_vocab_size`` tokens and ``d2t``, each draft id's offset to its
    target id (here every other target id), with ``t2d``."""
    import torch
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = json.loads((Path(target) / "config.json").read_text())
    config.update(
        num_hidden_layers=1,
        architectures=["LlamaForCausalLMEagle3"],
        draft_vocab_size=draft_vocab_size,
    )
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    hidden, inner, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    kv = config["num_key_value_heads"] * (hidden // config["num_attention_heads"])
    shapes = {
        "fc.weight": (hidden, 3 * hidden),
        "midlayer.self_attn.q_proj.weight": (hidden, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": (hidden, hidden),
        "midlayer.mlp.gate_proj.weight": (inner, hidden),
        "midlayer.mlp.up_proj.weight": (inner, hidden),
        "midlayer.mlp.down_proj.weight": (hidden, inner),
        "lm_head.weight": (draft_vocab_size, hidden),
    }
    generator = torch.Generator().manual_seed(seed)
    tensors = {
        name: torch.randn(shape, generator=generator) * 0.1 for name, shape in shapes.items()
    }
    for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        tensors[f"midlayer.{norm}.weight"] = torch.ones(hidden)
    tensors["norm.weight"] = torch.ones(hidden)
    target_ids = torch.arange(draft_vocab_size) * (vocab // draft_vocab_size)
    tensors["d2t"] = target_ids - torch.arange(draft_vocab_size)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[target_ids] = True
    tensors["t2d"] = t2d
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


def make_tiny_deepseek_mtp(directory: str | Path, target: str | Path, seed: int = 0) -> Path:
    """A copy of the tiny DeepSeek at ``target`` with a multi-token-prediction layer, as
    DeepSeek-V3's checkpoint carries it (transformers drops it): ``num_nextn_predict_layers`` 1
    and ``model.layers.{num_hidden_layers}.*``, a decoder layer of the last layer's kind (its
    tensors, copied) with ``enorm``, ``hnorm``, a random ``eh_proj`` and ``shared_head``."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    directory = Path(shutil.copytree(target, directory))
    config = json.loads((directory / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    tensors = load_file(str(directory / "model.safetensors"))
    last, mtp = config["num_hidden_layers"] - 1, config["num_hidden_layers"]
    for name, tensor in list(tensors.items()):
        if name.startswith(f"model.layers.{last}."):
            tensors[name.replace(f"layers.{last}.", f"layers.{mtp}.", 1)] = tensor.clone()
    hidden = config["hidden_size"]
    layer = f"model.layers.{mtp}."
    generator = torch.Generator().manual_seed(seed)
    tensors[layer + "enorm.weight"] = torch.ones(hidden)
    tensors[layer + "hnorm.weight"] = torch.ones(hidden)
    tensors[layer + "eh_proj.weight"] = torch.randn(hidden, 2 * hidden, generator=generator) * 0.1
    tensors[layer + "shared_head.norm.weight"] = torch.ones(hidden)
    tensors[layer + "shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    tensors[layer + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


@functools.cache
def _hf_causal_lm(path: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_greedy_tokens(path: str | Path, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """Transformers' greedy continuation of ``prompt_ids`` in float32 (EOS ignored): what the
    tests compare the engine with. EOS is neither a stop nor forbidden (``min_new_tokens`` would
    mask it out of the logits), as with ``ignore_eos``."""
    import torch

    ids = torch.tensor([prompt_ids])
    with torch.inference_mode():
        out = _hf_causal_lm(str(path)).generate(
            ids,
            eos_token_id=[],  # no stop token
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt_ids) :].tolist()


def make_tiny_lora(
    base: str | Path,
    directory: str | Path,
    *,
    rank: int = 8,
    alpha: int = 16,
    target_modules: Sequence[str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
    use_rslora: bool = False,
    seed: int = 0,
) -> Path:
    """Write a PEFT LoRA adapter for the tiny model at ``base`` into ``directory`` with peft
    itself (random A and B, so the adapter changes the outputs)."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = get_peft_model(
        _fresh_causal_lm(str(base)),
        LoraConfig(
            r=rank,
            lora_alpha=alpha,
            target_modules=list(target_modules),
            use_rslora=use_rslora,
            init_lora_weights=False,
        ),
    )
    model.save_pretrained(str(directory))
    return Path(directory)


def _fresh_causal_lm(path: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_peft_greedy_tokens(
    base: str | Path, adapter: str | Path, prompt_ids: list[int], max_tokens: int
) -> list[int]:
    """Transformers + peft's greedy continuation with ``adapter`` applied (float32, EOS ignored)."""
    import torch
    from peft import PeftModel

    model = PeftModel.from_pretrained(_fresh_causal_lm(str(base)), str(adapter)).eval()
    ids = torch.tensor([prompt_ids])
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt_ids) :].tolist()


def harmony_vocab_dir() -> Path | None:
    """The folder ``images/harmony-vocab.sh`` puts ``o200k_base.tiktoken`` in (openai-harmony's
    vocabulary, for TIKTOKEN_ENCODINGS_BASE), if the file is there."""
    folder = Path.home() / ".cache" / "infernetes" / "tiktoken"
    return folder if (folder / "o200k_base.tiktoken").is_file() else None


class StepTotals:
    """A stat logger for tests: what an engine's steps added up to, so a test can show that the
    path it meant to exercise ran (a preemption happened, the prefix cache hit, KV moved)."""

    def __init__(self) -> None:
        self.preemptions = 0
        self.prefix_hits = 0  # vllm:prefix_cache_hits: the device's cache only
        self.tokens_by_source = dict.fromkeys(
            PROMPT_TOKEN_SOURCES, 0
        )  # vllm:prompt_tokens_by_source
        self.copied_bytes: dict[str, int] = {}  # KV bytes moved, by transfer type
        self.transfers: list[Any] = []  # each KV transfer as the scheduler reported it

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        self.preemptions += scheduler_stats.num_preemptions
        self.prefix_hits += scheduler_stats.prefix_cache_stats.hits
        for source, count in iteration_stats.prompt_tokens_by_source.items():
            self.tokens_by_source[source] += count
        self.transfers += scheduler_stats.kv_transfers
        for transfer in scheduler_stats.kv_transfers:
            kind = transfer.transfer_type
            self.copied_bytes[kind] = self.copied_bytes.get(kind, 0) + transfer.num_bytes

    @classmethod
    def attach(cls, llm: Any) -> StepTotals:
        """A new one, recording every later step of the offline ``LLM``'s engine. (The engine
        logs and swallows a stat logger's exceptions, so assert on the totals, not in here.)"""
        totals = cls()
        llm.llm_engine.engine_core.stat_loggers.append(totals)
        return totals
