//! A small llama-architecture model in GGUF, written by the tests themselves (no download):
//! the format is GGUF version 3 as ggml's `docs/gguf.md` specifies it (header, metadata
//! key/values, tensor infos, then the tensors' data, each aligned to 32 bytes), with the
//! metadata llama.cpp's llama loader reads and a SentencePiece-style vocabulary (control
//! tokens, the 256 byte tokens for byte fallback, a few words), so that any prompt tokenizes.
//!
//! Weights are f32: random (a fixed-seed generator) for small models, or left as holes of a
//! sparse file for large ones, where only the size matters (the fake GPU runs no kernel code,
//! and llama.cpp maps the file, so zeros cost neither disk nor memory until copied).

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

/// A llama model's shape.
#[derive(Clone, Copy, Debug)]
pub struct Llama {
    pub layers: u32,
    pub embd: u32,
    pub ff: u32,
    pub heads: u32,
    pub context: u32,
    /// Random weights (true) or zeros in a sparse file (false).
    pub random: bool,
}

const ALIGNMENT: u64 = 32;
const GGML_TYPE_F32: u32 = 0;

/// Words after the control and byte tokens (`▁` marks a word start, as SentencePiece does).
const WORDS: &[&str] = &["▁", "▁the", "▁slice", "▁GPU", "▁hello", "e", "t", "a"];

impl Llama {
    fn vocab(&self) -> Vec<(String, i32)> {
        // (piece, token type): 2 unknown, 3 control, 6 byte, 1 normal.
        let mut v = vec![
            ("<unk>".to_string(), 2),
            ("<s>".to_string(), 3),
            ("</s>".to_string(), 3),
        ];
        v.extend((0..=255u8).map(|b| (format!("<0x{b:02X}>"), 6)));
        v.extend(WORDS.iter().map(|w| (w.to_string(), 1)));
        v
    }

    /// Each tensor's name and dimensions (ggml order: the first is the row length).
    fn tensors(&self) -> Vec<(String, Vec<u64>)> {
        let (e, f, n) = (self.embd as u64, self.ff as u64, self.vocab().len() as u64);
        let mut t = vec![
            ("token_embd.weight".to_string(), vec![e, n]),
            ("output_norm.weight".to_string(), vec![e]),
            ("output.weight".to_string(), vec![e, n]),
        ];
        for l in 0..self.layers {
            let b = format!("blk.{l}.");
            for (name, dims) in [
                ("attn_norm.weight", vec![e]),
                ("attn_q.weight", vec![e, e]),
                ("attn_k.weight", vec![e, e]),
                ("attn_v.weight", vec![e, e]),
                ("attn_output.weight", vec![e, e]),
                ("ffn_norm.weight", vec![e]),
                ("ffn_gate.weight", vec![e, f]),
                ("ffn_up.weight", vec![e, f]),
                ("ffn_down.weight", vec![f, e]),
            ] {
                t.push((b.clone() + name, dims));
            }
        }
        t
    }

    /// Bytes of one layer's weights (what offloading a layer moves to the GPU).
    pub fn layer_bytes(&self) -> u64 {
        let (e, f) = (self.embd as u64, self.ff as u64);
        4 * (2 * e + 4 * e * e + 3 * e * f)
    }

    /// Writes the model to `path`; returns the file's size.
    pub fn write(&self, path: &Path) -> u64 {
        let mut head = Vec::new();
        let tensors = self.tensors();
        let vocab = self.vocab();
        let kvs: Vec<(&str, Value)> = vec![
            ("general.architecture", Value::Str("llama".into())),
            ("general.name", Value::Str("gpuslice test llama".into())),
            ("general.alignment", Value::U32(ALIGNMENT as u32)),
            ("llama.context_length", Value::U32(self.context)),
            ("llama.embedding_length", Value::U32(self.embd)),
            ("llama.block_count", Value::U32(self.layers)),
            ("llama.feed_forward_length", Value::U32(self.ff)),
            ("llama.attention.head_count", Value::U32(self.heads)),
            ("llama.attention.head_count_kv", Value::U32(self.heads)),
            (
                "llama.rope.dimension_count",
                Value::U32(self.embd / self.heads),
            ),
            ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
            ("llama.vocab_size", Value::U32(vocab.len() as u32)),
            ("tokenizer.ggml.model", Value::Str("llama".into())),
            (
                "tokenizer.ggml.tokens",
                Value::Strs(vocab.iter().map(|(p, _)| p.clone()).collect()),
            ),
            (
                "tokenizer.ggml.scores",
                Value::F32s((0..vocab.len()).map(|i| -(i as f32)).collect()),
            ),
            (
                "tokenizer.ggml.token_type",
                Value::I32s(vocab.iter().map(|(_, t)| *t).collect()),
            ),
            ("tokenizer.ggml.unknown_token_id", Value::U32(0)),
            ("tokenizer.ggml.bos_token_id", Value::U32(1)),
            ("tokenizer.ggml.eos_token_id", Value::U32(2)),
            ("tokenizer.ggml.add_bos_token", Value::Bool(true)),
        ];
        head.extend(b"GGUF");
        head.extend(3u32.to_le_bytes());
        head.extend((tensors.len() as u64).to_le_bytes());
        head.extend((kvs.len() as u64).to_le_bytes());
        for (key, value) in &kvs {
            put_str(&mut head, key);
            value.put(&mut head);
        }
        let mut offset = 0u64;
        let mut placed = Vec::new();
        for (name, dims) in &tensors {
            put_str(&mut head, name);
            head.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                head.extend(d.to_le_bytes());
            }
            head.extend(GGML_TYPE_F32.to_le_bytes());
            head.extend(offset.to_le_bytes());
            let bytes = 4 * dims.iter().product::<u64>();
            placed.push((name.clone(), offset, bytes));
            offset = (offset + bytes).div_ceil(ALIGNMENT) * ALIGNMENT;
        }
        let data_start = (head.len() as u64).div_ceil(ALIGNMENT) * ALIGNMENT;
        head.resize(data_start as usize, 0);
        let mut file = std::fs::File::create(path).expect("create the model file");
        file.write_all(&head).expect("write the model's header");
        let total = data_start + offset;
        if self.random {
            let mut rng = 0x2545_f491_4f6c_dd1du64;
            for (name, at, bytes) in &placed {
                // Norm weights 1.0; the rest small random values.
                let norm = name.contains("norm");
                let mut data = Vec::with_capacity(*bytes as usize);
                for _ in 0..bytes / 4 {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let x = if norm {
                        1.0f32
                    } else {
                        ((rng >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
                    };
                    data.extend(x.to_le_bytes());
                }
                file.seek(SeekFrom::Start(data_start + at)).unwrap();
                file.write_all(&data).expect("write a tensor");
            }
        }
        file.set_len(total).expect("size the model file");
        total
    }
}

enum Value {
    U32(u32),
    F32(f32),
    Bool(bool),
    Str(String),
    Strs(Vec<String>),
    F32s(Vec<f32>),
    I32s(Vec<i32>),
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl Value {
    /// The value's GGUF type, then the value.
    fn put(&self, out: &mut Vec<u8>) {
        const UINT32: u32 = 4;
        const INT32: u32 = 5;
        const FLOAT32: u32 = 6;
        const BOOL: u32 = 7;
        const STRING: u32 = 8;
        const ARRAY: u32 = 9;
        let array = |out: &mut Vec<u8>, ty: u32, n: usize| {
            out.extend(ARRAY.to_le_bytes());
            out.extend(ty.to_le_bytes());
            out.extend((n as u64).to_le_bytes());
        };
        match self {
            Value::U32(v) => {
                out.extend(UINT32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Value::F32(v) => {
                out.extend(FLOAT32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Value::Bool(v) => {
                out.extend(BOOL.to_le_bytes());
                out.push(*v as u8);
            }
            Value::Str(s) => {
                out.extend(STRING.to_le_bytes());
                put_str(out, s);
            }
            Value::Strs(v) => {
                array(out, STRING, v.len());
                for s in v {
                    put_str(out, s);
                }
            }
            Value::F32s(v) => {
                array(out, FLOAT32, v.len());
                for x in v {
                    out.extend(x.to_le_bytes());
                }
            }
            Value::I32s(v) => {
                array(out, INT32, v.len());
                for x in v {
                    out.extend(x.to_le_bytes());
                }
            }
        }
    }
}
