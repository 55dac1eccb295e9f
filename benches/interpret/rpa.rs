//! `ragged_paged_attention_decode` and `ragged_paged_attention_mixed` (issue 23 item 4): the example's
//! launch (`examples/ragged_paged_attention.rs`, built for the CPU as the JAX op's CPU lowering
//! builds it: tpu-inference's default block sizes for the default target, with query blocks of at
//! most `CPU_QUERY_BLOCK` = 32 tokens) on the two batches of `benches/rpa_cpu.py`;
//! `ragged_paged_attention_mixed_tpu_blocks` is the mixed batch with `m_block_sizes = (128, 512, 128,
//! 256)`, tpu-inference's default for v5e and v6e (every block pads its prefill chunk of 8..64 tokens
//! to `bq` rows): what the CPU's default saves — the same metadata, written the same way here:
//! bf16, 8 query heads over 2 kv heads, head_dim 128, `sm_scale` 1/sqrt(128); 32 decoding sequences over
//! pages of 16 tokens, and 8 decoding + 8 prefill-chunk sequences over pages of 32 tokens. Each
//! sequence owns exactly the pages its kv length needs, in a shuffled order from a pool of just those
//! pages (+3). The floats are random; the outputs are checked against plain-Rust attention (f64) over
//! the updated cache, the cache element for element.
//!
//! The XLA side of these cases (tpu-inference's reference and the best jnp formulation) is in
//! `benches/rpa_cpu.py`; Pallas `interpret=True` cannot run the kernel (its DMA sizes are known only
//! at run time), so that column stays empty.
use crate::common::ragged_paged_attention as rpa;
use tpu_kernel::prelude::*;
use tpu_kernel::reference::Tolerance;

const HEADS: usize = 8;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 128;
/// The page shuffle: pool slot `k` holds page `(97 k + 13) mod pool` (`benches/rpa_cpu.py`'s `STRIDE`).
const STRIDE: usize = 97;

/// The case names (also `benches/rpa_cpu.py`'s `BATCHES`).
pub const CASES: [&str; 3] = [
    "ragged_paged_attention_decode",
    "ragged_paged_attention_mixed",
    "ragged_paged_attention_mixed_tpu_blocks",
];

struct Batch {
    tokens: usize,
    page_size: usize,
    pages_per_seq: usize,
    q_lens: Vec<usize>,
    kv_lens: Vec<usize>,
    decode: usize,
    /// `m_block_sizes`, when not tpu-inference's default.
    m_blocks: Option<[usize; 4]>,
}

fn batch(name: &str) -> Option<Batch> {
    let max_kv = 512;
    let decode_kv = |s: usize| 1 + (157 * s + 31) % max_kv;
    match name {
        "ragged_paged_attention_decode" => Some(Batch {
            tokens: 32,
            page_size: 16,
            pages_per_seq: 32,
            q_lens: vec![1; 32],
            kv_lens: (0..32).map(decode_kv).collect(),
            decode: 32,
            m_blocks: None,
        }),
        "ragged_paged_attention_mixed" | "ragged_paged_attention_mixed_tpu_blocks" => {
            let decode = 8;
            let q_lens: Vec<usize> = [1; 8]
                .into_iter()
                .chain([16, 48, 8, 64, 24, 32, 40, 12])
                .collect();
            let kv_lens = q_lens
                .iter()
                .enumerate()
                .map(|(s, &q)| {
                    if s < decode {
                        decode_kv(s)
                    } else {
                        q + (89 * s + 7) % (max_kv - q + 1)
                    }
                })
                .collect();
            Some(Batch {
                tokens: 256,
                page_size: 32,
                pages_per_seq: 16,
                q_lens,
                kv_lens,
                decode,
                m_blocks: name
                    .ends_with("_tpu_blocks")
                    .then_some([128, 512, 128, 256]),
            })
        }
        _ => None,
    }
}

/// `(kv_lens, page_indices, cu_q_lens, distribution, pool pages)` (`rpa_cpu.py`'s `batch_tables`).
fn tables(b: &Batch) -> (Vec<i32>, Vec<i32>, Vec<i32>, Vec<i32>, usize) {
    let seqs = b.q_lens.len();
    let need: Vec<usize> = b.kv_lens.iter().map(|k| k.div_ceil(b.page_size)).collect();
    let mut pool = need.iter().sum::<usize>() + 3;
    if pool.is_multiple_of(STRIDE) {
        pool += 1;
    }
    let mut table = vec![0i32; seqs * b.pages_per_seq];
    let mut k = 0;
    for (s, &n) in need.iter().enumerate() {
        for j in 0..n {
            table[s * b.pages_per_seq + j] = ((STRIDE * k + 13) % pool) as i32;
            k += 1;
        }
    }
    let mut cu = vec![0i32];
    for &q in &b.q_lens {
        cu.push(cu[cu.len() - 1] + q as i32);
    }
    let kv_lens = b.kv_lens.iter().map(|&k| k as i32).collect();
    let dist = vec![b.decode as i32, b.decode as i32, seqs as i32];
    (kv_lens, table, cu, dist, pool)
}

/// The launch for case `name`, built for the CPU: tpu-inference's default block sizes for the current
/// target with the CPU's query blocks, but the batch's `m_blocks`.
pub fn build(name: &str) -> Result<PallasCall, KernelError> {
    Executor::Cpu.scope(|| build_for(name))
}

fn build_for(name: &str) -> Result<PallasCall, KernelError> {
    let b = batch(name).expect("a ragged paged attention case");
    let (kv_lens, table, cu, _, pool) = tables(&b);
    let g = HEADS / KV_HEADS;
    rpa::ragged_paged_attention_launch(
        ArrayType::new([kv_lens.len()], I32),
        ArrayType::new([table.len()], I32),
        ArrayType::new([cu.len()], I32),
        ArrayType::new([3], I32),
        ArrayType::new([KV_HEADS, b.tokens, g / 2, 2, HEAD_DIM], BF16),
        ArrayType::new([b.tokens, KV_HEADS, 2, HEAD_DIM], BF16),
        ArrayType::new([pool, b.page_size, KV_HEADS, 2, HEAD_DIM], BF16),
        true,
        true,
        false,
        1.0 / (HEAD_DIM as f32).sqrt(),
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        b.m_blocks,
        None,
        Some(HEADS),
        None,
        Target::current(),
    )
}

/// The case's tables, then random `q`, `kv` and cache (seeds 4, 5, 6).
pub fn inputs(name: &str, call: &PallasCall) -> Vec<HostArray> {
    let b = batch(name).expect("a ragged paged attention case");
    let (kv_lens, table, cu, dist, _) = tables(&b);
    let ir = call.ir();
    let ops: Vec<_> = ir.inputs().collect();
    let random =
        |i: usize| HostArray::random(&ops[i].shape, ops[i].dtype, i as u64).expect("shape");
    vec![
        HostArray::from_vec([kv_lens.len()], kv_lens).expect("shape"),
        HostArray::from_vec([table.len()], table).expect("shape"),
        HostArray::from_vec([cu.len()], cu).expect("shape"),
        HostArray::from_vec([3], dist).expect("shape"),
        random(4),
        random(5),
        random(6),
    ]
}

/// The expected outputs of case `name`: the queries' array with every written token's attention (f64,
/// causal over its sequence's pages of the updated cache), and the cache with the new tokens in their
/// pages. bf16 tolerance (the kernel rounds the probabilities to bf16 for `p @ v`).
pub fn expected(
    name: &str,
    inputs: &[HostArray],
) -> Option<Result<(Vec<HostArray>, Tolerance), KernelError>> {
    let b = batch(name)?;
    let (kv_lens, table, cu, _, pool) = tables(&b);
    let (g, d, ps, pps) = (HEADS / KV_HEADS, HEAD_DIM, b.page_size, b.pages_per_seq);
    let t_all = b.tokens;
    let q = inputs[4].to_f64_vec();
    let kv = inputs[5].to_f64_vec();
    let mut cache = inputs[6].to_f64_vec();
    let row = KV_HEADS * 2 * d; // one token of the cache or of kv
    let at = |s: usize, p: usize| (table[s * pps + p / ps] as usize * ps + p % ps) * row;
    for s in 0..b.q_lens.len() {
        let (q0, q_len) = (cu[s] as usize, b.q_lens[s]);
        for t in 0..q_len {
            let dst = at(s, kv_lens[s] as usize - q_len + t);
            cache[dst..dst + row].copy_from_slice(&kv[(q0 + t) * row..(q0 + t + 1) * row]);
        }
    }
    let mut o = q.clone();
    let scale = 1.0 / (d as f64).sqrt();
    for s in 0..b.q_lens.len() {
        let (q0, q_len, kv_len) = (cu[s] as usize, b.q_lens[s], kv_lens[s] as usize);
        for t in 0..q_len {
            let pos = kv_len - q_len + t;
            for h in 0..KV_HEADS {
                let key = |p: usize| at(s, p) + 2 * h * d;
                for gi in 0..g {
                    let qi = ((h * t_all + q0 + t) * g + gi) * d;
                    let scores: Vec<f64> = (0..=pos)
                        .map(|p| scale * (0..d).map(|i| q[qi + i] * cache[key(p) + i]).sum::<f64>())
                        .collect();
                    let m = scores.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
                    let sum: f64 = e.iter().sum();
                    for i in 0..d {
                        let pv = (0..=pos).map(|p| e[p] * cache[key(p) + d + i]).sum::<f64>();
                        o[qi + i] = pv / sum;
                    }
                }
            }
        }
    }
    let f32s = |shape: &[usize], v: Vec<f64>| {
        HostArray::from_vec(shape, v.into_iter().map(|x| x as f32).collect::<Vec<f32>>())
    };
    let cache_shape = [pool, ps, KV_HEADS, 2, d];
    Some(
        f32s(inputs[4].shape(), o)
            .and_then(|o| Ok(vec![o, f32s(&cache_shape, cache)?]))
            .map(|outs| (outs, Tolerance::BF16)),
    )
}
