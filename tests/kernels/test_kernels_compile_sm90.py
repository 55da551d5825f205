"""Every Triton kernel compiles for Hopper (sm_90) down to a cubin, on a machine without a GPU.

The interpreter runs kernels as numpy code and misses what only the compiler checks (types of
loop-carried values, dot shapes, constexpr use). Triton compiles ahead of time for a named target,
so CI catches those errors too. Runs in a subprocess: the kernels must be imported without
TRITON_INTERPRET, which conftest sets for the other tests.
"""

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")  # no Triton wheels outside Linux

FP8 = dict(FP8_MAX=448.0, FP8_PREROUND=False, FP8_MANTISSA=3, FP8_MIN_EXP=-6)


def _cases():
    import triton.language as tl
    from infernetes.kernels.triton_backend import (
        activation,
        attention_decode,
        attention_prefill,
        cache,
        fp8,
        fp8_block,
        lora,
        moe,
        moe_wna16,
        norm,
        rotary,
        wna16,
    )

    attn = dict(
        FP8=False, SOFTCAP=False, SINKS=False, DOT_DTYPE=tl.bfloat16, PRECISION="tf32", BLOCK_D=128
    )
    attn_fp32 = dict(attn, DOT_DTYPE=tl.float32, PRECISION="ieee", BLOCK_D=64)
    bf16_attn = dict(q_ptr="*bf16", k_cache_ptr="*bf16", v_cache_ptr="*bf16", out_ptr="*bf16")
    fp8_cache = dict(k_cache_ptr="*fp8e4nv", v_cache_ptr="*fp8e4nv")
    fp32_attn = dict(q_ptr="*fp32", k_cache_ptr="*fp32", v_cache_ptr="*fp32", out_ptr="*fp32")
    decode = dict(
        sinks_ptr="*fp32",
        softcap="fp32",
        k_scale_ptr="*fp32",
        v_scale_ptr="*fp32",
        tables_ptr="*i32",
        seq_lens_ptr="*i32",
        part_acc_ptr="*fp32",
        part_m_ptr="*fp32",
        part_l_ptr="*fp32",
        qk_scale="fp32",
    )
    prefill = dict(
        sinks_ptr="*fp32",
        softcap="fp32",
        k_scale_ptr="*fp32",
        v_scale_ptr="*fp32",
        tables_ptr="*i32",
        cu_q_ptr="*i32",
        seq_lens_ptr="*i32",
        qk_scale="fp32",
    )
    split = dict(NUM_SPLITS=4, BLOCK_G=16, BLOCK_N=64)
    return [
        (attention_decode.decode_split_kernel, {**decode, **bf16_attn}, {**split, **attn}, {}),
        (
            attention_decode.decode_split_kernel,
            {**decode, **bf16_attn, **fp8_cache},
            {**split, **attn, "FP8": True},
            {},
        ),
        (
            attention_decode.decode_split_kernel,
            {**decode, **bf16_attn},
            {**split, **attn, "NUM_SPLITS": 1},
            {},
        ),
        (  # soft-capping and sinks (Gemma 2, gpt-oss), one split
            attention_decode.decode_split_kernel,
            {**decode, **bf16_attn},
            {**split, **attn, "NUM_SPLITS": 1, "SOFTCAP": True, "SINKS": True},
            {},
        ),
        (  # DeepSeek's latent attention: one KV head of 576 (512 + 64 rope), 16 heads a rank
            attention_decode.decode_split_kernel,
            {**decode, **bf16_attn},
            {**split, **attn, "BLOCK_N": 32, "BLOCK_D": 1024},
            {},
        ),
        (
            attention_decode.decode_merge_kernel,
            dict(
                part_acc_ptr="*fp32",
                part_m_ptr="*fp32",
                part_l_ptr="*fp32",
                out_ptr="*bf16",
                sinks_ptr="*fp32",
            ),
            dict(SINKS=False, NUM_SPLITS=4, BLOCK_S=4, BLOCK_D=128),
            {},
        ),
        (
            attention_decode.decode_merge_kernel,
            dict(
                part_acc_ptr="*fp32",
                part_m_ptr="*fp32",
                part_l_ptr="*fp32",
                out_ptr="*bf16",
                sinks_ptr="*fp32",
            ),
            dict(SINKS=True, NUM_SPLITS=4, BLOCK_S=4, BLOCK_D=128),
            {},
        ),
        (
            attention_prefill.prefill_kernel,
            {**prefill, **bf16_attn},
            dict(BLOCK_Q=16, GROUP_PAD=4, BLOCK_N=64, **attn),
            {},
        ),
        (
            attention_prefill.prefill_kernel,
            {**prefill, **bf16_attn},
            dict(BLOCK_Q=16, GROUP_PAD=4, BLOCK_N=64, **{**attn, "SOFTCAP": True, "SINKS": True}),
            {},
        ),
        (  # latent attention: 16 heads over one KV head of 576
            attention_prefill.prefill_kernel,
            {**prefill, **bf16_attn},
            dict(BLOCK_Q=1, GROUP_PAD=16, BLOCK_N=32, **{**attn, "BLOCK_D": 1024}),
            {},
        ),
        (
            attention_prefill.prefill_kernel,
            {**prefill, **fp32_attn},
            dict(BLOCK_Q=16, GROUP_PAD=1, BLOCK_N=64, **attn_fp32),
            {},
        ),
        (
            cache.store_kv_kernel,
            dict(
                key_ptr="*bf16",
                value_ptr="*bf16",
                k_cache_ptr="*fp8e4nv",
                v_cache_ptr="*fp8e4nv",
                slot_ptr="*i64",
                k_scale_ptr="*fp32",
                v_scale_ptr="*fp32",
            ),
            dict(FP8=True, BLOCK_H=8, BLOCK_D=128, **FP8),
            {},
        ),
        (
            norm.rms_norm_kernel,
            dict(
                x_ptr="*bf16",
                res_ptr="*bf16",
                w_ptr="*bf16",
                out_ptr="*bf16",
                res_out_ptr="*bf16",
                eps="fp32",
            ),
            dict(HAS_RESIDUAL=True, BLOCK_R=1, BLOCK=4096),
            dict(num_warps=8),
        ),
        (
            norm.rms_norm_kernel,
            dict(
                x_ptr="*bf16",
                res_ptr="*bf16",
                w_ptr="*bf16",
                out_ptr="*bf16",
                res_out_ptr="*bf16",
                eps="fp32",
            ),
            dict(HAS_RESIDUAL=False, BLOCK_R=16, BLOCK=128),
            dict(num_warps=4),
        ),
        (
            rotary.rotary_kernel,
            dict(
                pos_ptr="*i64",
                cache_ptr="*fp32",
                q_ptr="*bf16",
                k_ptr="*bf16",
                q_out_ptr="*bf16",
                k_out_ptr="*bf16",
            ),
            dict(HALF=16, IS_NEOX=False, BLOCK_HQ=32, BLOCK_HK=8, BLOCK_HALF=16, BLOCK_PASS=32),
            {},
        ),
        (
            activation.silu_and_mul_kernel,
            dict(x_ptr="*bf16", out_ptr="*bf16"),
            dict(BLOCK=1024),
            {},
        ),
        (
            fp8.quant_kernel,
            dict(x_ptr="*bf16", q_ptr="*fp8e4nv", scale_ptr="*fp32"),
            dict(BLOCK=1024, **FP8),
            {},
        ),
        (
            fp8.quant_per_token_kernel,
            dict(x_ptr="*bf16", q_ptr="*fp8e4nv", scale_ptr="*fp32"),
            dict(MIN_S=1e-12, BLOCK=2048, **FP8),
            {},
        ),
        (
            fp8.dequant_matmul_kernel,
            dict(
                x_ptr="*bf16",
                w_ptr="*fp8e4nv",
                scale_ptr="*fp32",
                bias_ptr="*bf16",
                out_ptr="*bf16",
            ),
            dict(
                PER_CHANNEL=True,
                HAS_BIAS=True,
                DOT_DTYPE=tl.bfloat16,
                PRECISION="tf32",
                BLOCK_M=64,
                BLOCK_N=64,
                BLOCK_K=64,
            ),
            {},
        ),
        *(
            (
                moe.moe_gemm_kernel,
                dict(
                    a_ptr="*bf16",
                    w_ptr=weight,
                    scale_ptr="*fp32",
                    weight_ptr="*fp32",
                    out_ptr="*bf16",
                    sorted_rows_ptr="*i32",
                    block_expert_ptr="*i32",
                ),
                dict(
                    A_ROW_DIV=div,
                    SCALE_MODE=mode,
                    BLOCK_SN=128 if mode == 3 else 1,
                    BLOCK_SK=128 if mode == 3 else 1,
                    MUL_ROUTING_WEIGHT=div == 1,
                    DOT_DTYPE=tl.bfloat16,
                    PRECISION="tf32",
                    BLOCK_M=16,
                    BLOCK_N=64,
                    BLOCK_K=64,
                ),
                {},
            )
            for weight, mode, div in (
                ("*bf16", 0, 8),
                ("*bf16", 0, 1),
                ("*fp8e4nv", 2, 1),
                ("*fp8e4nv", 3, 8),  # block-wise fp8 experts
            )
        ),
        (
            lora.lora_shrink_kernel,
            dict(x_ptr="*bf16", a_ptr="*bf16", idx_ptr="*i32", out_ptr="*bf16"),
            dict(BLOCK_R=16, BLOCK_K=64),
            {},
        ),
        (
            lora.lora_expand_kernel,
            dict(s_ptr="*bf16", b_ptr="*bf16", idx_ptr="*i32", out_ptr="*bf16"),
            dict(BLOCK_N=64, BLOCK_R=16),
            {},
        ),
        *(
            (
                wna16.wna16_matmul_kernel,
                dict(
                    x_ptr="*bf16",
                    qw_ptr="*i32",
                    scales_ptr="*bf16",
                    zeros_ptr="*i32",
                    g_idx_ptr="*i32",
                    bias_ptr="*bf16",
                    out_ptr="*bf16",
                ),
                dict(
                    BITS=bits,
                    HAS_ZEROS=zeros,
                    HAS_BIAS=True,
                    DOT_DTYPE=tl.bfloat16,
                    PRECISION="tf32",
                    BLOCK_M=16,
                    BLOCK_N=64,
                    BLOCK_K=64,
                ),
                {},
            )
            for bits, zeros in ((4, True), (8, False))
        ),
        (
            fp8_block.block_fp8_matmul_kernel,
            dict(
                x_ptr="*bf16",
                w_ptr="*fp8e4nv",
                scale_ptr="*fp32",
                bias_ptr="*bf16",
                out_ptr="*bf16",
            ),
            dict(
                BLOCK_SN=128,
                BLOCK_SK=128,
                HAS_BIAS=True,
                DOT_DTYPE=tl.bfloat16,
                PRECISION="tf32",
                BLOCK_M=16,
                BLOCK_N=64,
                BLOCK_K=64,
            ),
            {},
        ),
        *(
            (
                moe_wna16.moe_wna16_gemm_kernel,
                dict(
                    a_ptr="*bf16",
                    qw_ptr="*i32",
                    scales_ptr="*bf16",
                    zeros_ptr="*i32",
                    g_idx_ptr="*i32",
                    weight_ptr="*fp32",
                    out_ptr="*bf16",
                    sorted_rows_ptr="*i32",
                    block_expert_ptr="*i32",
                ),
                dict(
                    A_ROW_DIV=div,
                    BITS=bits,
                    HAS_ZEROS=zeros,
                    MUL_ROUTING_WEIGHT=div == 1,
                    DOT_DTYPE=tl.bfloat16,
                    PRECISION="tf32",
                    BLOCK_M=16,
                    BLOCK_N=64,
                    BLOCK_K=64,
                ),
                {},
            )
            for bits, zeros, div in ((4, True, 8), (8, False, 1))
        ),
    ]


def compile_all() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    for kernel, types, constexprs, options in _cases():
        # pointers and floats as given; every other runtime argument is an int32 (sizes, strides)
        signature = {
            name: "constexpr" if name in constexprs else types.get(name, "i32")
            for name in kernel.arg_names
        }
        # what the JIT assumes at a real launch: 16-byte aligned pointers, strides that are multiples of 16
        aligned = {
            (i,): [["tt.divisibility", 16]]
            for i, name in enumerate(kernel.arg_names)
            if signature[name].startswith("*")
            or name.startswith("stride")
            or name in ("head_dim", "block_size")
        }
        compiled = triton.compile(
            ASTSource(kernel, signature, constexprs, aligned),
            target=GPUTarget("cuda", 90, 32),
            options=options or None,
        )
        assert compiled.asm["cubin"], kernel.__name__
        print(f"{kernel.__name__}: compiled for sm_90", flush=True)


@pytest.mark.slow
def test_every_triton_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    proc = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("compiled for sm_90") == len(_cases())


if __name__ == "__main__":
    compile_all()
