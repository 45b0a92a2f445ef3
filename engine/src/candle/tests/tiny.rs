//! Tiny random-weight llama models written as GGUF files by the tests, and a naive dense f64
//! forward pass over the same weights as the reference.

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Shape of a tiny model.
#[derive(Clone, Copy, Debug)]
pub struct TinySpec {
    pub n_layer: usize,
    pub hidden: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub context: usize,
    pub rope_theta: f32,
    pub eps: f32,
    pub eos: u32,
    pub seed: u64,
    /// Whether the output projection is the embedding table (no `output.weight`).
    pub tied: bool,
    /// Store every matrix (the blocks' weights and the embedding, which the tied output
    /// projection reuses) as Q4_1 instead of f32; the reference uses the dequantized weights.
    pub q4_1: bool,
}

impl Default for TinySpec {
    /// Two layers, hidden 64, 4 heads over 2 KV heads (GQA), vocabulary 101 (not a multiple of
    /// any kernel's tile), context 512.
    fn default() -> Self {
        TinySpec {
            n_layer: 2,
            hidden: 64,
            n_head: 4,
            n_head_kv: 2,
            ffn: 96,
            vocab: 101,
            context: 512,
            rope_theta: 10_000.0,
            eps: 1e-5,
            eos: 1,
            seed: 7,
            tied: true,
            q4_1: false,
        }
    }
}

/// A tiny model on disk plus its weights (row-major `[out, in]`) for the reference.
#[derive(Debug)]
pub struct TinyModel {
    pub spec: TinySpec,
    pub path: PathBuf,
    _dir: tempfile::TempDir,
    w: HashMap<String, Vec<f32>>,
}

/// `shape` f32 weights as a GGUF tensor of `dtype`, and the values the file then holds (Q4_1
/// rounds them).
fn tensor(data: &[f32], shape: &[usize], dtype: GgmlDType) -> (QTensor, Vec<f32>) {
    let t = Tensor::from_slice(data, shape, &Device::Cpu).expect("tensor");
    let q = QTensor::quantize(&t, dtype).expect("quantize");
    let back = q
        .dequantize(&Device::Cpu)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f32>())
        .expect("dequantize");
    (q, back)
}

impl TinyModel {
    /// Generates random weights and writes the GGUF file (f32 tensors).
    pub fn new(spec: TinySpec) -> TinyModel {
        let s = spec;
        let hd = s.hidden / s.n_head;
        let kvd = s.n_head_kv * hd;
        let mut rng = StdRng::seed_from_u64(s.seed);
        let mut uniform = |n: usize, scale: f32, offset: f32| -> Vec<f32> {
            (0..n)
                .map(|_| offset + scale * (rng.random::<f32>() * 2.0 - 1.0))
                .collect()
        };
        // (name, rows, cols, data)
        let mut tensors: Vec<(String, usize, usize, Vec<f32>)> = Vec::new();
        tensors.push((
            "token_embd.weight".into(),
            s.vocab,
            s.hidden,
            uniform(s.vocab * s.hidden, 1.0, 0.0),
        ));
        let lin = |rows: usize, cols: usize| (rows, cols, 1.5 / (cols as f32).sqrt());
        for l in 0..s.n_layer {
            let n = |x: &str| format!("blk.{l}.{x}.weight");
            for (name, (rows, cols, scale)) in [
                (n("attn_q"), lin(s.hidden, s.hidden)),
                (n("attn_k"), lin(kvd, s.hidden)),
                (n("attn_v"), lin(kvd, s.hidden)),
                (n("attn_output"), lin(s.hidden, s.hidden)),
                (n("ffn_gate"), lin(s.ffn, s.hidden)),
                (n("ffn_up"), lin(s.ffn, s.hidden)),
                (n("ffn_down"), lin(s.hidden, s.ffn)),
            ] {
                tensors.push((name, rows, cols, uniform(rows * cols, scale, 0.0)));
            }
            tensors.push((n("attn_norm"), 1, s.hidden, uniform(s.hidden, 0.2, 1.0)));
            tensors.push((n("ffn_norm"), 1, s.hidden, uniform(s.hidden, 0.2, 1.0)));
        }
        tensors.push((
            "output_norm.weight".into(),
            1,
            s.hidden,
            uniform(s.hidden, 0.2, 1.0),
        ));
        if !s.tied {
            tensors.push((
                "output.weight".into(),
                s.vocab,
                s.hidden,
                uniform(s.vocab * s.hidden, 0.5, 0.0),
            ));
        }

        let u = |x: usize| Value::U32(x as u32);
        let metadata = [
            ("general.architecture", Value::String("llama".into())),
            ("llama.block_count", u(s.n_layer)),
            ("llama.context_length", u(s.context)),
            ("llama.embedding_length", u(s.hidden)),
            ("llama.feed_forward_length", u(s.ffn)),
            ("llama.attention.head_count", u(s.n_head)),
            ("llama.attention.head_count_kv", u(s.n_head_kv)),
            ("llama.rope.freq_base", Value::F32(s.rope_theta)),
            ("llama.attention.layer_norm_rms_epsilon", Value::F32(s.eps)),
            ("llama.rope.dimension_count", u(hd)),
            ("tokenizer.ggml.eos_token_id", Value::U32(s.eos)),
        ];
        let mut w = HashMap::new();
        let mut qtensors = Vec::new();
        for (name, rows, cols, data) in tensors {
            // candle writes a tensor's dims innermost first, as GGUF wants them.
            let (q, data) = if rows == 1 {
                tensor(&data, &[cols], GgmlDType::F32)
            } else if s.q4_1 {
                tensor(&data, &[rows, cols], GgmlDType::Q4_1)
            } else {
                tensor(&data, &[rows, cols], GgmlDType::F32)
            };
            qtensors.push((name.clone(), q));
            w.insert(name, data);
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("tiny-llama.gguf");
        let mut file = std::fs::File::create(&path).expect("create tiny model");
        let md: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
        let ts: Vec<(&str, &QTensor)> = qtensors.iter().map(|(k, q)| (k.as_str(), q)).collect();
        gguf_file::write(&mut file, &md, &ts).expect("write tiny model");
        TinyModel {
            spec,
            path,
            _dir: dir,
            w,
        }
    }

    fn t(&self, name: &str) -> &[f32] {
        &self.w[name]
    }

    /// Dense f64 reference: the logits after every token of `tokens` (positions 0..).
    pub fn reference_logits(&self, tokens: &[u32]) -> Vec<Vec<f64>> {
        let s = self.spec;
        let hd = s.hidden / s.n_head;
        let group = s.n_head / s.n_head_kv;
        let n = tokens.len();
        let mut x: Vec<Vec<f64>> = tokens
            .iter()
            .map(|&t| {
                self.t("token_embd.weight")[t as usize * s.hidden..][..s.hidden]
                    .iter()
                    .map(|&v| f64::from(v))
                    .collect()
            })
            .collect();
        let rms = |v: &[f64], w: &[f32]| -> Vec<f64> {
            let ms = v.iter().map(|a| a * a).sum::<f64>() / v.len() as f64;
            let r = 1.0 / (ms + f64::from(s.eps)).sqrt();
            v.iter()
                .zip(w)
                .map(|(a, &b)| a * r * f64::from(b))
                .collect()
        };
        let matvec = |w: &[f32], rows: usize, v: &[f64]| -> Vec<f64> {
            (0..rows)
                .map(|r| {
                    w[r * v.len()..][..v.len()]
                        .iter()
                        .zip(v)
                        .map(|(&a, b)| f64::from(a) * b)
                        .sum()
                })
                .collect()
        };
        let rope = |v: &mut [f64], pos: usize| {
            for head in v.chunks_mut(hd) {
                for i in 0..hd / 2 {
                    let a = pos as f64 * f64::from(s.rope_theta).powf(-2.0 * i as f64 / hd as f64);
                    let (x0, x1) = (head[2 * i], head[2 * i + 1]);
                    head[2 * i] = x0 * a.cos() - x1 * a.sin();
                    head[2 * i + 1] = x0 * a.sin() + x1 * a.cos();
                }
            }
        };
        for l in 0..s.n_layer {
            let n_ = |x: &str| format!("blk.{l}.{x}.weight");
            let kvd = s.n_head_kv * hd;
            let mut qs = Vec::new();
            let mut ks = Vec::new();
            let mut vs = Vec::new();
            for (pos, xt) in x.iter().enumerate() {
                let h = rms(xt, self.t(&n_("attn_norm")));
                let mut q = matvec(self.t(&n_("attn_q")), s.hidden, &h);
                let mut k = matvec(self.t(&n_("attn_k")), kvd, &h);
                rope(&mut q, pos);
                rope(&mut k, pos);
                qs.push(q);
                ks.push(k);
                vs.push(matvec(self.t(&n_("attn_v")), kvd, &h));
            }
            for t in 0..n {
                let mut attn = vec![0f64; s.hidden];
                for h in 0..s.n_head {
                    let g = h / group;
                    let q = &qs[t][h * hd..][..hd];
                    let sc: Vec<f64> = (0..=t)
                        .map(|j| {
                            q.iter()
                                .zip(&ks[j][g * hd..][..hd])
                                .map(|(a, b)| a * b)
                                .sum::<f64>()
                                / (hd as f64).sqrt()
                        })
                        .collect();
                    let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = sc.iter().map(|v| (v - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (j, ej) in e.iter().enumerate() {
                        for d in 0..hd {
                            attn[h * hd + d] += ej / z * vs[j][g * hd + d];
                        }
                    }
                }
                let o = matvec(self.t(&n_("attn_output")), s.hidden, &attn);
                x[t].iter_mut().zip(o).for_each(|(a, b)| *a += b);
                let h = rms(&x[t], self.t(&n_("ffn_norm")));
                let g = matvec(self.t(&n_("ffn_gate")), s.ffn, &h);
                let u = matvec(self.t(&n_("ffn_up")), s.ffn, &h);
                let a: Vec<f64> = g
                    .iter()
                    .zip(&u)
                    .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                    .collect();
                let d = matvec(self.t(&n_("ffn_down")), s.hidden, &a);
                x[t].iter_mut().zip(d).for_each(|(a, b)| *a += b);
            }
        }
        let head = if s.tied {
            "token_embd.weight"
        } else {
            "output.weight"
        };
        x.iter()
            .map(|xt| {
                matvec(
                    self.t(head),
                    s.vocab,
                    &rms(xt, self.t("output_norm.weight")),
                )
            })
            .collect()
    }
}

/// Deterministic pseudo-random tokens below `vocab` (avoiding `avoid`, e.g. the EOS id).
pub fn tokens(n: usize, vocab: usize, seed: u64, avoid: u32) -> Vec<u32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            loop {
                let t = rng.random_range(0..vocab as u32);
                if t != avoid {
                    break t;
                }
            }
        })
        .collect()
}
