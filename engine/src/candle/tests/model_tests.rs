//! The forward pass against a dense reference, the two attention implementations against each
//! other, and the determinism that makes batching, chunking and KV transfer lossless.

use candle_core::Device;

use super::tiny::{TinyModel, TinySpec, tokens};
use crate::candle::attention::Span;
use crate::candle::config::WeightFormat;
use crate::candle::kv_store::KvStore;
use crate::candle::linear::TiledKernels;
use crate::candle::model::{AttnImpl, Llama, LoadOptions};
use crate::types::BlockId;

const BS: usize = 16;

fn load(m: &TinyModel, format: WeightFormat, pad: bool) -> (Llama, KvStore) {
    load_with(m, format, pad, TiledKernels::default())
}

fn load_with(
    m: &TinyModel,
    format: WeightFormat,
    pad: bool,
    tiled: TiledKernels,
) -> (Llama, KvStore) {
    let opts = LoadOptions {
        format,
        pad,
        block_size: BS,
        max_context: None,
        layers: None,
        tiled,
    };
    let model = Llama::load(&m.path, opts, &Device::Cpu).expect("load tiny model");
    let p = &model.params;
    let kv = KvStore::new(p.n_layer, 32, BS, p.kv_dim(), &Device::Cpu).expect("kv");
    (model, kv)
}

/// Runs `tokens` from `position` as one span; the logits of `rows` (relative to the span).
fn forward(
    model: &Llama,
    kv: &KvStore,
    tokens: &[u32],
    position: usize,
    table: &[BlockId],
    rows: &[usize],
) -> Vec<Vec<f32>> {
    let span = Span {
        start: 0,
        len: tokens.len(),
        position,
        table,
    };
    model
        .forward(kv, tokens, &[span], rows)
        .expect("forward")
        .map(|l| l.to_vec2::<f32>().expect("logits"))
        .unwrap_or_default()
}

fn max_err(got: &[Vec<f32>], want: &[Vec<f64>]) -> (f64, f64) {
    let mut err = 0f64;
    let mut scale = 0f64;
    for (g, w) in got.iter().zip(want) {
        for (a, b) in g.iter().zip(w) {
            err = err.max((f64::from(*a) - b).abs());
            scale = scale.max(b.abs());
        }
    }
    (err, scale)
}

#[test]
fn forward_matches_a_dense_reference() {
    let m = TinyModel::new(TinySpec::default());
    let prompt = tokens(40, m.spec.vocab, 1, m.spec.eos);
    let want = m.reference_logits(&prompt);
    let all: Vec<usize> = (0..prompt.len()).collect();
    // Blocks out of order: the paged layout must not matter.
    let table = [9, 0, 5];
    for pad in [false, true] {
        let (model, kv) = load(&m, WeightFormat::F32, pad);
        let got = forward(&model, &kv, &prompt, 0, &table, &all);
        let (err, scale) = max_err(&got, &want);
        assert!(
            err < 1e-4 * scale.max(1.0),
            "f32 pad={pad}: max error {err} (scale {scale})"
        );
    }
    for pad in [false, true] {
        let (model, kv) = load(&m, WeightFormat::Q8_0, pad);
        let got = forward(&model, &kv, &prompt, 0, &table, &all);
        let (err, scale) = max_err(&got, &want);
        assert!(
            err < 0.05 * scale,
            "q8_0 pad={pad}: max error {err} (scale {scale})"
        );
    }
}

#[test]
fn long_prompts_in_chunks_match_the_reference() {
    let m = TinyModel::new(TinySpec {
        context: 1024,
        seed: 11,
        ..TinySpec::default()
    });
    let prompt = tokens(600, m.spec.vocab, 9, m.spec.eos);
    let want = m.reference_logits(&prompt);
    let (model, _) = load(&m, WeightFormat::F32, false);
    let p = &model.params;
    let kv = KvStore::new(p.n_layer, 40, BS, p.kv_dim(), &Device::Cpu).expect("kv");
    let table: Vec<BlockId> = (0..40).rev().collect();
    forward(&model, &kv, &prompt[..300], 0, &table, &[]);
    let got = forward(&model, &kv, &prompt[300..], 300, &table, &[0, 211, 299]);
    let want: Vec<Vec<f64>> = [300, 511, 599].iter().map(|&i| want[i].clone()).collect();
    let (err, scale) = max_err(&got, &want);
    assert!(
        err < 1e-4 * scale.max(1.0),
        "max error {err} (scale {scale})"
    );
}

#[test]
fn untied_output_and_keep_format_load() {
    let m = TinyModel::new(TinySpec {
        tied: false,
        seed: 3,
        ..TinySpec::default()
    });
    let prompt = tokens(20, m.spec.vocab, 2, m.spec.eos);
    let want = m.reference_logits(&prompt);
    let (model, kv) = load(&m, WeightFormat::Keep, false);
    let got = forward(&model, &kv, &prompt, 0, &[3, 4], &[19]);
    let (err, scale) = max_err(&got, &want[19..]);
    assert!(
        err < 1e-4 * scale.max(1.0),
        "max error {err} (scale {scale})"
    );
}

#[test]
fn tensor_attention_matches_the_cpu_kernel() {
    let m = TinyModel::new(TinySpec::default());
    let prompt = tokens(45, m.spec.vocab, 4, m.spec.eos);
    let all: Vec<usize> = (0..prompt.len()).collect();
    let (model, kv) = load(&m, WeightFormat::F32, false);
    let native = forward(&model, &kv, &prompt[..30], 0, &[2, 7, 1], &all[..30]);
    let native_tail = forward(&model, &kv, &prompt[30..], 30, &[2, 7, 1], &all[..15]);
    let (mut model_t, kv_t) = load(&m, WeightFormat::F32, false);
    model_t.attention = AttnImpl::Tensors;
    let tensors = forward(&model_t, &kv_t, &prompt[..30], 0, &[4, 0, 3], &all[..30]);
    let tensors_tail = forward(&model_t, &kv_t, &prompt[30..], 30, &[4, 0, 3], &all[..15]);
    for (a, b) in native
        .iter()
        .chain(&native_tail)
        .zip(tensors.iter().chain(&tensors_tail))
    {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-4 * x.abs().max(1.0), "{x} vs {y}");
        }
    }
}

/// Exported bytes of the blocks covering `tokens` positions.
fn export(kv: &KvStore, table: &[BlockId], tokens: usize) -> Vec<bytes::Bytes> {
    (0..tokens.div_ceil(BS))
        .map(|i| {
            let filled = (tokens - i * BS).min(BS);
            kv.export_block(table[i], filled).expect("export")
        })
        .collect()
}

#[test]
fn chunked_prefill_equals_one_shot_prefill_bit_for_bit() {
    let m = TinyModel::new(TinySpec::default());
    let prompt = tokens(37, m.spec.vocab, 5, m.spec.eos);
    for (format, pad) in [(WeightFormat::Q8_0, true), (WeightFormat::Q8_0, false)] {
        let (model, kv) = load(&m, format, pad);
        let one = forward(&model, &kv, &prompt, 0, &[0, 1, 2], &[36]);
        let mut chunked = Vec::new();
        let table = [7, 3, 11];
        let mut pos = 0;
        for n in [5, 16, 1, 15] {
            chunked = forward(&model, &kv, &prompt[pos..pos + n], pos, &table, &[n - 1]);
            pos += n;
        }
        assert_eq!(one, chunked, "{format} pad={pad}: last logits differ");
        assert_eq!(
            export(&kv, &[0, 1, 2], 37),
            export(&kv, &table, 37),
            "{format} pad={pad}: KV differs"
        );
    }
}

#[test]
fn batched_decode_equals_one_at_a_time_bit_for_bit() {
    let m = TinyModel::new(TinySpec::default());
    let (model, kv) = load(&m, WeightFormat::Q8_0, true);
    let prompts: Vec<Vec<u32>> = [(9, 11), (23, 12), (16, 13)]
        .iter()
        .map(|&(n, seed)| tokens(n, m.spec.vocab, seed, m.spec.eos))
        .collect();
    // Sequence i uses blocks [4i, 4i + 4) when alone and [16 + 4i, 20 + 4i) when batched.
    let tables: Vec<Vec<BlockId>> = (0..3).map(|i| (4 * i..4 * i + 4).collect()).collect();
    let batched_tables: Vec<Vec<BlockId>> =
        (0..3).map(|i| (16 + 4 * i..20 + 4 * i).collect()).collect();
    let mut next_alone = Vec::new();
    let mut next_batched = Vec::new();
    for i in 0..3 {
        let p = &prompts[i];
        let l = forward(&model, &kv, p, 0, &tables[i], &[p.len() - 1]);
        let b = forward(&model, &kv, p, 0, &batched_tables[i], &[p.len() - 1]);
        assert_eq!(l, b);
        next_alone.push(crate::candle::sampler::argmax(&l[0]));
        next_batched.push(next_alone[i]);
    }
    for step in 0..6 {
        // One at a time.
        let mut alone = Vec::new();
        for i in 0..3 {
            let pos = prompts[i].len() + step;
            let l = forward(&model, &kv, &[next_alone[i]], pos, &tables[i], &[0]);
            next_alone[i] = crate::candle::sampler::argmax(&l[0]);
            alone.push(l.into_iter().next().unwrap_or_default());
        }
        // All three in one ragged batch.
        let spans: Vec<Span<'_>> = (0..3)
            .map(|i| Span {
                start: i,
                len: 1,
                position: prompts[i].len() + step,
                table: &batched_tables[i],
            })
            .collect();
        let batched = model
            .forward(&kv, &next_batched, &spans, &[0, 1, 2])
            .expect("forward")
            .expect("logits")
            .to_vec2::<f32>()
            .expect("logits");
        assert_eq!(alone, batched, "step {step}");
        for i in 0..3 {
            next_batched[i] = crate::candle::sampler::argmax(&batched[i]);
        }
    }
    for i in 0..3 {
        let n = prompts[i].len() + 6;
        assert_eq!(
            export(&kv, &tables[i], n),
            export(&kv, &batched_tables[i], n)
        );
    }
}

#[test]
fn import_rejects_wrong_sizes_and_non_finite_values() {
    let m = TinyModel::new(TinySpec::default());
    let (model, kv) = load(&m, WeightFormat::Q8_0, false);
    let prompt = tokens(20, m.spec.vocab, 6, m.spec.eos);
    forward(&model, &kv, &prompt, 0, &[1, 2], &[]);
    let full = kv.export_block(1, 16).expect("export");
    assert_eq!(full.len(), 16 * kv.bytes_per_token());
    let part = kv.export_block(2, 4).expect("export");
    assert_eq!(part.len(), 4 * kv.bytes_per_token());
    kv.import_block(5, 16, &full).expect("import");
    assert_eq!(kv.export_block(5, 16).expect("export"), full);
    assert!(kv.import_block(6, 16, &full[..full.len() - 4]).is_err());
    let mut nan = part.to_vec();
    nan[8..12].copy_from_slice(&f32::NAN.to_le_bytes());
    assert!(matches!(
        kv.import_block(6, 4, &nan),
        Err(crate::error::BackendError::Corrupt(_))
    ));
    assert!(
        kv.import_block(99, 4, &part).is_err(),
        "block outside the pool"
    );
    assert!(
        kv.export_block(1, 17).is_err(),
        "more tokens than a block holds"
    );
}

/// Export and import speed of full blocks at SmolLM2-135M's shape (30 layers, 3 KV heads of 64):
/// a measurement, not a check. `cargo test --release -p dolphin-engine --features candle --lib
/// -- --ignored --nocapture kv_block_copy_speed`.
#[test]
#[ignore = "a measurement; run by hand"]
fn kv_block_copy_speed() {
    let blocks = 32u32;
    let rounds = 20;
    // As a streaming prefill exports: a round's blocks are still on their way (held) while the
    // next round's are exported, and dropped after.
    let export = |kv: &KvStore| {
        let mut exported = Vec::new();
        let started = std::time::Instant::now();
        for _ in 0..rounds {
            exported = (0..blocks)
                .map(|b| kv.export_block(b, BS).expect("export"))
                .collect::<Vec<_>>();
        }
        (started.elapsed(), exported)
    };
    let fresh = KvStore::new(30, 64, BS, 192, &candle_core::Device::Cpu)
        .expect("kv")
        .without_export_reuse();
    let (export_fresh, _) = export(&fresh);
    drop(fresh);
    let kv = KvStore::new(30, 64, BS, 192, &candle_core::Device::Cpu).expect("kv");
    let (export_reused, exported) = export(&kv);
    let started = std::time::Instant::now();
    for _ in 0..rounds {
        for (b, data) in exported.iter().enumerate() {
            kv.import_block(32 + b as u32, BS, data).expect("import");
        }
    }
    let import = started.elapsed();
    let bytes = (rounds * exported.iter().map(bytes::Bytes::len).sum::<usize>()) as f64;
    let gbs = |d: std::time::Duration| bytes / d.as_secs_f64() / 1e9;
    println!(
        "kv block export {:.2} GB/s (fresh buffers {:.2} GB/s), import {:.2} GB/s ({} bytes per block)",
        gbs(export_reused),
        gbs(export_fresh),
        gbs(import),
        exported[0].len()
    );
}

/// The file's Q4_1 weights on the tiled Q4_1 kernel (`--weights keep`): close to the dense
/// reference of those (dequantized) weights, and batching and chunking change no bit.
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
#[test]
fn q4_1_weights_on_the_tiled_kernel() {
    // On AVX2, and on AVX-512 VNNI where this CPU has it (else AVX2 twice).
    for wide in [false, true] {
        q4_1_weights_on_the_tiled_kernel_with(wide);
    }
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
fn q4_1_weights_on_the_tiled_kernel_with(wide: bool) {
    let m = TinyModel::new(TinySpec {
        q4_1: true,
        seed: 5,
        ..TinySpec::default()
    });
    let tiled = TiledKernels {
        q8: false,
        q4: true,
        wide,
    };
    let (model, kv) = load_with(&m, WeightFormat::Keep, false, tiled);
    let prompt = tokens(40, m.spec.vocab, 4, m.spec.eos);
    let want = m.reference_logits(&prompt);
    let all: Vec<usize> = (0..prompt.len()).collect();
    let got = forward(&model, &kv, &prompt, 0, &[9, 0, 5], &all);
    let (err, scale) = max_err(&got, &want);
    assert!(err < 0.05 * scale, "max error {err} (scale {scale})");

    // Chunked prefill equals one shot, and the KV too.
    let one = forward(&model, &kv, &prompt[..37], 0, &[0, 1, 2], &[36]);
    let table = [7, 3, 11];
    let mut pos = 0;
    let mut chunked = Vec::new();
    for n in [5, 16, 1, 15] {
        chunked = forward(&model, &kv, &prompt[pos..pos + n], pos, &table, &[n - 1]);
        pos += n;
    }
    assert_eq!(one, chunked);
    assert_eq!(export(&kv, &[0, 1, 2], 37), export(&kv, &table, 37));

    // Three sequences decoded in one batch equal each decoded alone.
    // Two blocks each (prompts of at most 19 tokens, four steps), apart from those used above.
    let tables: Vec<Vec<BlockId>> = (0..3).map(|i| (12 + 2 * i..14 + 2 * i).collect()).collect();
    let batched_tables: Vec<Vec<BlockId>> =
        (0..3).map(|i| (20 + 2 * i..22 + 2 * i).collect()).collect();
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|i| tokens(9 + 5 * i, m.spec.vocab, 20 + i as u64, m.spec.eos))
        .collect();
    let mut next = Vec::new();
    for i in 0..3 {
        let p = &prompts[i];
        let l = forward(&model, &kv, p, 0, &tables[i], &[p.len() - 1]);
        assert_eq!(
            l,
            forward(&model, &kv, p, 0, &batched_tables[i], &[p.len() - 1])
        );
        next.push(crate::candle::sampler::argmax(&l[0]));
    }
    for step in 0..4 {
        let alone: Vec<Vec<f32>> = (0..3)
            .map(|i| {
                let pos = prompts[i].len() + step;
                forward(&model, &kv, &[next[i]], pos, &tables[i], &[0]).remove(0)
            })
            .collect();
        let spans: Vec<Span<'_>> = (0..3)
            .map(|i| Span {
                start: i,
                len: 1,
                position: prompts[i].len() + step,
                table: &batched_tables[i],
            })
            .collect();
        let batched = model
            .forward(&kv, &next, &spans, &[0, 1, 2])
            .expect("forward")
            .expect("logits")
            .to_vec2::<f32>()
            .expect("logits");
        assert_eq!(alone, batched, "step {step}");
        for i in 0..3 {
            next[i] = crate::candle::sampler::argmax(&batched[i]);
        }
    }
}

/// `--weights auto` keeps a Q4_1 file's weights where the tiled Q4_1 kernel runs, re-quantizes
/// anything else (and Q4_1 where only candle's kernels run) to Q8_0, and leaves an explicit
/// format alone.
#[test]
fn auto_weights_keep_a_q4_1_file_where_the_tiled_kernel_runs() {
    use crate::candle::{CandleConfig, MatmulKernel};
    let q4_1 = TinyModel::new(TinySpec {
        q4_1: true,
        ..TinySpec::default()
    });
    let f32_file = TinyModel::new(TinySpec::default());
    let resolve = |m: &TinyModel, matmul: MatmulKernel, weights: WeightFormat| {
        let mut cfg = CandleConfig::new(&m.path);
        cfg.matmul = matmul;
        cfg.weights = weights;
        cfg.resolved().expect("resolves").weights
    };
    let tiled_here = crate::candle::linear::TILED_BUILT;
    let want = if tiled_here {
        WeightFormat::Keep
    } else {
        WeightFormat::Q8_0
    };
    for matmul in [MatmulKernel::Auto, MatmulKernel::TiledAvx2] {
        assert_eq!(resolve(&q4_1, matmul, WeightFormat::Auto), want, "{matmul}");
    }
    let auto = WeightFormat::Auto;
    assert_eq!(
        resolve(&q4_1, MatmulKernel::Candle, auto),
        WeightFormat::Q8_0
    );
    assert_eq!(
        resolve(&f32_file, MatmulKernel::Auto, auto),
        WeightFormat::Q8_0
    );
    for explicit in [WeightFormat::Q8_0, WeightFormat::Keep, WeightFormat::F32] {
        assert_eq!(resolve(&q4_1, MatmulKernel::Auto, explicit), explicit);
    }
    // An unreadable file is an error only when the choice depends on it.
    let mut missing = CandleConfig::new("/nonexistent/model.gguf");
    if tiled_here {
        assert!(missing.resolved().is_err());
    }
    missing.weights = WeightFormat::Q8_0;
    assert!(missing.resolved().is_ok());
}
