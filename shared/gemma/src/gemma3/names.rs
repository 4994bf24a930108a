//! Tensor roles of a Gemma 3 decoder: their shapes and their names in the HF and GGUF
//! layouts.

use super::config::GemmaConfig;

/// A per-layer tensor of the decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LayerTensor {
    AttnNorm,
    Q,
    K,
    V,
    O,
    QNorm,
    KNorm,
    PostAttnNorm,
    PreFfnNorm,
    Gate,
    Up,
    Down,
    PostFfnNorm,
}

impl LayerTensor {
    /// Every per-layer tensor, in checkpoint order.
    pub(crate) const ALL: [LayerTensor; 13] = {
        use LayerTensor::*;
        [
            AttnNorm,
            Q,
            K,
            V,
            O,
            QNorm,
            KNorm,
            PostAttnNorm,
            PreFfnNorm,
            Gate,
            Up,
            Down,
            PostFfnNorm,
        ]
    };
}

/// Any tensor of the decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Embed,
    FinalNorm,
    LmHead,
    Layer(usize, LayerTensor),
}

impl Role {
    /// Whether this tensor is an RMSNorm weight (HF stores `w`, GGUF stores `1 + w`).
    pub(crate) fn is_norm(self) -> bool {
        use LayerTensor::*;
        match self {
            Role::FinalNorm => true,
            Role::Layer(_, t) => matches!(
                t,
                AttnNorm | QNorm | KNorm | PostAttnNorm | PreFfnNorm | PostFfnNorm
            ),
            _ => false,
        }
    }

    /// Shape of the tensor under `cfg`: `[outputs, inputs]` for matrices, `[len]` for vectors.
    pub(crate) fn shape(self, cfg: &GemmaConfig) -> Vec<usize> {
        use LayerTensor::*;
        let (h, f, q, kv) = (
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.q_dim(),
            cfg.kv_dim(),
        );
        match self {
            Role::Embed | Role::LmHead => vec![cfg.vocab_size, h],
            Role::FinalNorm => vec![h],
            Role::Layer(_, t) => match t {
                Q => vec![q, h],
                K | V => vec![kv, h],
                O => vec![h, q],
                Gate | Up => vec![f, h],
                Down => vec![h, f],
                QNorm | KNorm => vec![cfg.head_dim],
                AttnNorm | PostAttnNorm | PreFfnNorm | PostFfnNorm => vec![h],
            },
        }
    }

    /// Name in transformers' `Gemma3ForCausalLM` state dict.
    pub(crate) fn hf_name(self) -> String {
        use LayerTensor::*;
        match self {
            Role::Embed => "model.embed_tokens.weight".into(),
            Role::FinalNorm => "model.norm.weight".into(),
            Role::LmHead => "lm_head.weight".into(),
            Role::Layer(i, t) => {
                let leaf = match t {
                    AttnNorm => "input_layernorm",
                    Q => "self_attn.q_proj",
                    K => "self_attn.k_proj",
                    V => "self_attn.v_proj",
                    O => "self_attn.o_proj",
                    QNorm => "self_attn.q_norm",
                    KNorm => "self_attn.k_norm",
                    PostAttnNorm => "post_attention_layernorm",
                    PreFfnNorm => "pre_feedforward_layernorm",
                    Gate => "mlp.gate_proj",
                    Up => "mlp.up_proj",
                    Down => "mlp.down_proj",
                    PostFfnNorm => "post_feedforward_layernorm",
                };
                format!("model.layers.{i}.{leaf}.weight")
            }
        }
    }

    /// Name in llama.cpp's GGUF conversion of Gemma 3.
    pub(crate) fn gguf_name(self) -> String {
        use LayerTensor::*;
        match self {
            Role::Embed => "token_embd.weight".into(),
            Role::FinalNorm => "output_norm.weight".into(),
            Role::LmHead => "output.weight".into(),
            Role::Layer(i, t) => {
                let leaf = match t {
                    AttnNorm => "attn_norm",
                    Q => "attn_q",
                    K => "attn_k",
                    V => "attn_v",
                    O => "attn_output",
                    QNorm => "attn_q_norm",
                    KNorm => "attn_k_norm",
                    PostAttnNorm => "post_attention_norm",
                    PreFfnNorm => "ffn_norm",
                    Gate => "ffn_gate",
                    Up => "ffn_up",
                    Down => "ffn_down",
                    PostFfnNorm => "post_ffw_norm",
                };
                format!("blk.{i}.{leaf}.weight")
            }
        }
    }
}
