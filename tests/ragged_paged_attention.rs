//! Ragged paged attention (examples/ragged_paged_attention.rs, issue 23) in both CPU engines: the
//! interpreter and the emitted Mosaic module run on the CPU agree (the attention within summation
//! order, the updated cache bit for bit), every DMA completion timing gives the interpreter's bits
//! with no race reported, the new tokens land in their pages and nothing else of the cache changes,
//! and an f32 launch matches a plain-Rust attention over the pages. Correctness against
//! tpu-inference's own reference is `python/tests/test_ragged_paged_attention.py`.

use tpu_kernel::prelude::*;
use tpu_kernel::reference::random_inputs;
use tpu_kernel::runtime::mosaic_cpu;

#[allow(dead_code)]
#[path = "../examples/ragged_paged_attention.rs"]
mod rpa;

/// A launch at a small config: `seqs` sequences of up to `pps` pages of `ps` tokens, `tokens` query
/// tokens, `heads` query heads over `kv_heads`, head_dim 128, `dtype` cache.
fn launch(
    (seqs, pps, ps, pages, tokens): (usize, usize, usize, usize, usize),
    (heads, kv_heads): (usize, usize),
    dtype: DType,
    m_blocks: Option<[usize; 4]>,
) -> PallasCall {
    let pk = (32 / dtype.bit_width() as usize).max(1);
    let (q_dtype, q_pk) = if dtype == F32 { (F32, 1) } else { (BF16, 2) };
    let group = heads / kv_heads;
    let gp = group.div_ceil(q_pk) * q_pk;
    let rows = (2 * kv_heads).div_ceil(pk);
    rpa::ragged_paged_attention_launch(
        ArrayType::new([seqs], I32),
        ArrayType::new([seqs * pps], I32),
        ArrayType::new([seqs + 1], I32),
        ArrayType::new([3], I32),
        ArrayType::new([kv_heads, tokens, gp / q_pk, q_pk, 128], q_dtype),
        ArrayType::new([tokens, rows, pk, 128], dtype),
        ArrayType::new([pages, ps, rows, pk, 128], dtype),
        true,
        true,
        false,
        0.125,
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
        m_blocks,
        None,
        Some(heads),
        None,
        Target::DEFAULT,
    )
    .expect("builds")
}

fn f32s(a: &HostArray) -> Vec<f32> {
    a.to_f64_vec().iter().map(|x| *x as f32).collect()
}

fn bits(a: &HostArray) -> Vec<u32> {
    if let Some(v) = a.as_slice::<f32>() {
        return v.iter().map(|x| x.to_bits()).collect();
    }
    if let Some(v) = a.as_slice::<bf16>() {
        return v.iter().map(|x| x.to_bits() as u32).collect();
    }
    if let Some(v) = a.as_slice::<f8e4m3fn>() {
        return v.iter().map(|x| x.to_bits() as u32).collect();
    }
    a.as_slice::<f8e5m2>()
        .expect("f32, bf16 or an 8-bit float")
        .iter()
        .map(|x| x.to_bits() as u32)
        .collect()
}

/// The query tokens the tables give work to (`cu_q_lens[S]`): the attention rows both engines write.
fn written_tokens(inputs: &[HostArray]) -> usize {
    let cu = inputs[2].as_slice::<i32>().expect("i32");
    *cu.last().expect("cu_q_lens") as usize
}

/// The elements of the output (laid out as `q`, `[Hkv, T, Gp / pk, pk, D]`) that hold written
/// tokens: per kv head, the first `cu_q_lens[S]` tokens' rows.
fn written_ranges(inputs: &[HostArray]) -> Vec<std::ops::Range<usize>> {
    let n = written_tokens(inputs);
    let q_shape = inputs[4].shape();
    let per_token = q_shape[2] * q_shape[3] * q_shape[4];
    (0..q_shape[0])
        .map(|h| {
            let at = h * q_shape[1] * per_token;
            at..at + n * per_token
        })
        .collect()
}

/// Outputs of the two engines: the attention within `tol` on the written tokens, the cache bit for bit.
fn engines_agree(call: &PallasCall, inputs: &[HostArray], tol: f32) -> Vec<HostArray> {
    let want = call.interpret(inputs).expect("interpret");
    let got = mosaic_cpu::compile(call.ir())
        .and_then(|c| c.run(inputs))
        .expect("mosaic_cpu");
    let (g, w) = (f32s(&got[0]), f32s(&want[0]));
    for i in written_ranges(inputs).into_iter().flatten() {
        assert!(
            (g[i] - w[i]).abs() <= tol * (1.0 + w[i].abs()),
            "attention element {i}: mosaic_cpu {} vs interpreter {}",
            g[i],
            w[i]
        );
    }
    assert_eq!(bits(&got[1]), bits(&want[1]), "the updated caches differ");
    want
}

#[test]
fn both_engines_agree_on_the_example_and_on_an_f32_launch() {
    let call = rpa::build().expect("builds");
    for seed in [1, 2] {
        engines_agree(&call, &random_inputs(&call, seed), 2e-2);
    }
    let f32_call = launch((4, 4, 16, 24, 40), (4, 2), F32, Some([8, 32, 8, 16]));
    engines_agree(&f32_call, &random_inputs(&f32_call, 3), 1e-4);
    // An 8-bit cache: key and value bytes out of the packed words, widened to bf16.
    for dtype in [F8E4M3FN, F8E5M2] {
        let f8_call = launch((4, 4, 16, 24, 40), (8, 4), dtype, Some([8, 32, 8, 16]));
        engines_agree(&f8_call, &random_inputs(&f8_call, 4), 2e-2);
    }
}

#[test]
fn every_dma_timing_gives_the_same_bits_and_no_race() {
    let call = rpa::build().expect("builds");
    let inputs = random_inputs(&call, 7);
    let want = call.interpret(&inputs).expect("interpret");
    for seed in 1..6 {
        let opts = InterpretOptions {
            dma_seed: Some(seed),
            ..InterpretOptions::default()
        };
        let got = call
            .interpret_with(&inputs, &opts)
            .unwrap_or_else(|e| panic!("dma_seed {seed}: {e}"));
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(bits(g), bits(w), "dma_seed {seed}");
        }
    }
}

/// The interpreter's fast paths change no bit of the example's bf16 launch: among them, the keys and
/// values of each landed KV chunk read in place by the `dot`s (`PlanCounts::halves_in_place`) instead of
/// copied through the word-half casts. Signaling and quiet NaNs and infinities are planted in the
/// cache, so some reach the `dot`s (which quiet a signaling NaN as the cast would have) and some only
/// the masked-off rows.
#[test]
fn the_fast_paths_give_the_plain_bits_with_nans_in_the_cache() {
    let call = rpa::build().expect("builds");
    let opts = |fuse| InterpretOptions {
        fuse,
        ..InterpretOptions::default()
    };
    let counts = tpu_kernel::runtime::interpret::plan_counts(call.ir(), &opts(true)).expect("plan");
    assert!(counts.halves_in_place >= 2, "{counts:?}");
    let mut inputs = random_inputs(&call, 13);
    let cache = &inputs[6];
    let specials = [0x7F81u16, 0xFFBF, 0x7FC0, 0x7F80, 0xFF80];
    let planted: Vec<bf16> = cache
        .as_slice::<bf16>()
        .expect("a bf16 cache")
        .iter()
        .enumerate()
        .map(|(i, &x)| match i % 997 {
            0..=4 => bf16::from_bits(specials[i % 997]),
            _ => x,
        })
        .collect();
    inputs[6] = HostArray::from_vec(cache.shape(), planted).expect("shape");
    let fused = call.interpret_with(&inputs, &opts(true)).expect("fused");
    let plain = call.interpret_with(&inputs, &opts(false)).expect("plain");
    for (i, (f, p)) in fused.iter().zip(&plain).enumerate() {
        assert_eq!(bits(f), bits(p), "output {i}");
    }
    let nans = f32s(&fused[0]).iter().filter(|x| x.is_nan()).count();
    assert!(
        nans > 0 && nans < fused[0].len(),
        "some attention rows see a NaN: {nans}"
    );
}

/// The cache after a launch: every new token's row (row `q0 + t` of `kv`) at its position
/// `kv_len - q_len + t` of its sequence's pages, every other row as it was.
#[test]
fn the_new_tokens_land_in_their_pages_and_nothing_else_changes() {
    let call = rpa::build().expect("builds");
    let inputs = random_inputs(&call, 11);
    let out = call.interpret(&inputs).expect("interpret");
    let (lens, table, cu) = (
        inputs[0].as_slice::<i32>().unwrap(),
        inputs[1].as_slice::<i32>().unwrap(),
        inputs[2].as_slice::<i32>().unwrap(),
    );
    let cache_shape = inputs[6].shape().to_vec();
    let (ps, row) = (cache_shape[1], cache_shape[2..].iter().product::<usize>());
    let pps = table.len() / lens.len();
    let kv = bits(&inputs[5]);
    let mut want = bits(&inputs[6]);
    for s in 0..lens.len() {
        let (q0, q_len) = (cu[s] as usize, (cu[s + 1] - cu[s]) as usize);
        for t in 0..q_len {
            let pos = lens[s] as usize - q_len + t;
            let page = table[s * pps + pos / ps] as usize;
            let at = (page * ps + pos % ps) * row;
            want[at..at + row].copy_from_slice(&kv[(q0 + t) * row..(q0 + t + 1) * row]);
        }
    }
    assert_eq!(bits(&out[1]), want);
}

/// Plain-Rust attention of every written token over its sequence's pages of the updated cache
/// (f32: key `h` is cache row `2h`, value `h` row `2h + 1`), causal, scaled by the launch's 0.125.
#[test]
fn an_f32_launch_matches_plain_attention_over_the_pages() {
    let (heads, kv_heads) = (4, 2);
    let call = launch(
        (4, 4, 16, 24, 40),
        (heads, kv_heads),
        F32,
        Some([8, 32, 8, 16]),
    );
    let inputs = random_inputs(&call, 5);
    let out = call.interpret(&inputs).expect("interpret");
    let (lens, table, cu) = (
        inputs[0].as_slice::<i32>().unwrap(),
        inputs[1].as_slice::<i32>().unwrap(),
        inputs[2].as_slice::<i32>().unwrap(),
    );
    let q = inputs[4].as_slice::<f32>().unwrap();
    let cache = out[1].as_slice::<f32>().unwrap();
    let o = out[0].as_slice::<f32>().unwrap();
    let (tokens, g, d, ps) = (inputs[4].shape()[1], heads / kv_heads, 128, 16);
    let pps = table.len() / lens.len();
    let row = 2 * kv_heads * d;
    let mut worst = 0f32;
    for s in 0..lens.len() {
        let (q0, q_len, kv_len) = (
            cu[s] as usize,
            (cu[s + 1] - cu[s]) as usize,
            lens[s] as usize,
        );
        for t in 0..q_len {
            let pos = kv_len - q_len + t;
            for h in 0..kv_heads {
                for gi in 0..g {
                    let qi = ((h * tokens + q0 + t) * g + gi) * d;
                    let qv = &q[qi..qi + d];
                    let kv_at = |p: usize, which: usize| {
                        let page = table[s * pps + p / ps] as usize;
                        let base = (page * ps + p % ps) * row + (2 * h + which) * d;
                        &cache[base..base + d]
                    };
                    let scores: Vec<f64> = (0..=pos)
                        .map(|p| {
                            let k = kv_at(p, 0);
                            0.125 * (0..d).map(|i| qv[i] as f64 * k[i] as f64).sum::<f64>()
                        })
                        .collect();
                    let m = scores.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
                    let sum: f64 = e.iter().sum();
                    for i in 0..d {
                        let want: f64 =
                            (0..=pos).map(|p| e[p] * kv_at(p, 1)[i] as f64).sum::<f64>() / sum;
                        let got = o[qi + i] as f64;
                        worst = worst.max((got - want).abs() as f32);
                    }
                }
            }
        }
    }
    assert!(worst < 1e-4, "largest difference {worst}");
}

/// As tpu-inference's launch: the whole-array operands pinned to HBM (`pltpu.HBM`) and libtpu's
/// bounds and semaphore checks off (its defaults; at the small config they cost 40% more scheduled
/// bundles on v5e, measured: 1127 vs 795 for the decode loop).
#[test]
fn the_launch_pins_its_operands_to_hbm_and_turns_libtpus_checks_off() {
    let call = rpa::build().expect("builds");
    let config = call.custom_call().backend_config().expect("config");
    assert!(
        config.contains("\"disable_bounds_checks\":true"),
        "{config}"
    );
    assert!(
        config.contains("\"disable_semaphore_checks\":true"),
        "{config}"
    );
    let text = call.mosaic_mlir().expect("verified module");
    assert!(text.contains("#tpu.memory_space<hbm>"), "{text}");
    assert!(!text.contains("#tpu.memory_space<any>"), "{text}");
}

/// The query block is a schedule, not a numerics choice: each query row's scores, softmax and
/// output are computed alone over the same KV chunks, and a chunk wholly past a row's causal
/// limit adds nothing to it (its probabilities are exactly 0, its rescale exactly 1). So query
/// blocks of 8 or 16 tokens — what a CPU caller picks for short prefill chunks, where the
/// default's 128-token blocks compute mostly padding — give the bits of 32-token blocks on a
/// ragged batch: the attention of every written token and the updated cache.
#[test]
fn query_block_sizes_do_not_change_the_bits() {
    let blocks = |bq: usize, bq_c: usize| Some([bq, 32, bq_c, 16]);
    let base = launch((4, 4, 16, 24, 40), (8, 2), BF16, blocks(32, 32));
    let inputs = random_inputs(&base, 9);
    let want = base.interpret(&inputs).expect("interpret");
    let ranges = written_ranges(&inputs);
    let written = |a: &HostArray| {
        let b = bits(a);
        ranges
            .iter()
            .flat_map(|r| b[r.clone()].to_vec())
            .collect::<Vec<_>>()
    };
    for (bq, bq_c) in [(8, 8), (16, 8), (16, 16), (32, 8)] {
        let call = launch((4, 4, 16, 24, 40), (8, 2), BF16, blocks(bq, bq_c));
        let got = call.interpret(&inputs).expect("interpret");
        assert!(
            written(&got[0]) == written(&want[0]),
            "the attention differs with query blocks ({bq}, {bq_c})"
        );
        assert!(
            bits(&got[1]) == bits(&want[1]),
            "the cache differs ({bq}, {bq_c})"
        );
    }
}

/// A launch built for the CPU (as the JAX op's CPU lowering builds it) caps tpu-inference's default
/// query blocks at `CPU_QUERY_BLOCK` tokens and keeps its KV blocks; given blocks are used as given.
/// The query block sizes the query buffer (`[kv heads, bq, ..]`, the second scratch).
#[test]
fn a_launch_built_for_the_cpu_caps_the_default_query_blocks() {
    let q_block = |call: &PallasCall| call.ir().scratch().nth(1).expect("q buffer").shape[1];
    let kv_block = |call: &PallasCall| call.ir().scratch().next().expect("kv buffer").shape[1];
    let config = ((4, 32, 16, 130, 512), (8, 2));
    let tpu = launch(config.0, config.1, BF16, None);
    let cpu = Executor::Cpu.scope(|| launch(config.0, config.1, BF16, None));
    // tpu-inference's mixed default at 512 tokens, group 4 on v5e: 256-token query blocks.
    assert_eq!(q_block(&tpu), 256);
    assert_eq!(q_block(&cpu), rpa::CPU_QUERY_BLOCK);
    assert_eq!(kv_block(&cpu), kv_block(&tpu));
    let given = Some([64, 32, 64, 16]);
    let cpu_given = Executor::Cpu.scope(|| launch(config.0, config.1, BF16, given));
    assert_eq!(q_block(&cpu_given), 64);
    assert_eq!(
        rpa::cpu_query_blocks(rpa::Blocks {
            bq: 128,
            bkv: 512,
            bq_c: 128,
            bkv_c: 256
        }),
        rpa::Blocks {
            bq: 32,
            bkv: 512,
            bq_c: 32,
            bkv_c: 256
        }
    );
}

/// The loops over kv heads run across threads (their iterations are independent: each writes only
/// its head's softmax statistics and accumulator rows) and give the bits of the loops run in order,
/// for a bf16, an f32 and an 8-bit cache, with uninitialized memory poisoned too.
#[test]
fn split_head_loops_give_the_sequential_bits() {
    let calls = [
        rpa::build().expect("builds"),
        launch((4, 4, 16, 24, 40), (4, 2), F32, Some([8, 32, 8, 16])),
        launch((4, 4, 16, 24, 40), (8, 4), F8E4M3FN, Some([8, 32, 8, 16])),
    ];
    for (i, call) in calls.iter().enumerate() {
        let split =
            tpu_kernel::runtime::interpret::plan_counts(call.ir(), &InterpretOptions::default())
                .expect("plan")
                .split_loops;
        assert!(split >= 1, "launch {i}: no loop over kv heads is split");
        let inputs = random_inputs(call, 20 + i as u64);
        for poison in [false, true] {
            let opts = |parallel| InterpretOptions {
                parallel,
                poison_uninitialized: poison,
                ..InterpretOptions::default()
            };
            let par = call.interpret_with(&inputs, &opts(true)).expect("split");
            let seq = call
                .interpret_with(&inputs, &opts(false))
                .expect("in order");
            for (p, s) in par.iter().zip(&seq) {
                assert_eq!(bits(p), bits(s), "launch {i}, poison {poison}");
            }
        }
    }
}
