//! Flash attention's kernels beyond the example's forward (which every-example suites cover): the
//! residual forward writes the log-sum-exp, the backward kernels give the gradients of attention (vs an
//! f64 reference), the interpreter and the shipped Mosaic module agree on all of them, causal blocks are
//! skipped without fetching, and a `fwd` that does not fit its kernel is a library problem.

#[path = "../examples/flash_attention.rs"]
#[allow(dead_code)]
mod flash_attention;
#[path = "../examples/matmul.rs"]
#[allow(dead_code)]
mod matmul;

use flash_attention::*;
use tpu_kernel::prelude::*;
use tpu_kernel::reference::{compare, Tolerance};
use tpu_kernel::runtime::interpret::HostArray;
use tpu_kernel::runtime::mosaic_cpu;

const BH: usize = 2;
const SEQ: usize = 256;
const D: usize = 128;
const BLOCK: (usize, usize) = (128, 128);

fn bf16s(seed: u64) -> (Vec<f64>, HostArray) {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let v: Vec<bf16> = (0..BH * SEQ * D)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            bf16::from_f32(((state >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0)
        })
        .collect();
    let wide = v.iter().map(|x| x.to_f64()).collect();
    (wide, HostArray::from_vec([BH, SEQ, D], v).unwrap())
}

fn arr() -> ArrayType {
    ArrayType::new([BH, SEQ, D], BF16)
}

/// Attention and its gradients in f64 for cotangent `g`: (o, lse, dq, dk, dv), each `[BH, SEQ, D]`
/// (lse `[BH, SEQ]`).
#[allow(clippy::type_complexity)]
fn reference(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    g: &[f64],
    causal: bool,
) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let scale = 1.0 / (D as f64).sqrt();
    let n = BH * SEQ * D;
    let (mut o, mut lse) = (vec![0.0; n], vec![0.0; BH * SEQ]);
    let (mut dq, mut dk, mut dv) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    let at = |h: usize, r: usize, c: usize| (h * SEQ + r) * D + c;
    for h in 0..BH {
        for r in 0..SEQ {
            let keys = if causal { r + 1 } else { SEQ };
            let s: Vec<f64> = (0..keys)
                .map(|c| (0..D).map(|x| q[at(h, r, x)] * k[at(h, c, x)]).sum::<f64>() * scale)
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let l: f64 = s.iter().map(|x| (x - m).exp()).sum();
            lse[h * SEQ + r] = m + l.ln();
            let p: Vec<f64> = s.iter().map(|x| (x - lse[h * SEQ + r]).exp()).collect();
            for x in 0..D {
                o[at(h, r, x)] = (0..keys).map(|c| p[c] * v[at(h, c, x)]).sum();
            }
            let di: f64 = (0..D).map(|x| g[at(h, r, x)] * o[at(h, r, x)]).sum();
            for c in 0..keys {
                let dp: f64 = (0..D).map(|x| g[at(h, r, x)] * v[at(h, c, x)]).sum();
                let ds = p[c] * (dp - di);
                for x in 0..D {
                    dv[at(h, c, x)] += p[c] * g[at(h, r, x)];
                    dq[at(h, r, x)] += ds * k[at(h, c, x)] * scale;
                    dk[at(h, c, x)] += ds * q[at(h, r, x)] * scale;
                }
            }
        }
    }
    (o, lse, dq, dk, dv)
}

/// Within 3% of the reference's largest magnitude (bf16 probabilities and dS feed the MXU, as in Pallas).
fn close(what: &str, got: &HostArray, want: &[f64]) {
    let got = got.to_f64_vec();
    assert_eq!(got.len(), want.len(), "{what}: size");
    let scale = want.iter().fold(0.0f64, |a, x| a.max(x.abs()));
    let err = got
        .iter()
        .zip(want)
        .fold(0.0f64, |a, (x, y)| a.max((x - y).abs()));
    assert!(
        err <= 0.03 * scale,
        "{what}: max error {err} vs scale {scale}"
    );
}

/// The interpreter and the Mosaic module agree to within bf16 rounding (their `exp`s differ by ulps).
fn engines_agree(call: &PallasCall, inputs: &[HostArray]) -> Vec<HostArray> {
    let want = call.interpret(inputs).expect("interpret");
    let got = mosaic_cpu::compile(call.ir())
        .and_then(|c| c.run(inputs))
        .expect("mosaic_cpu");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let c = compare(g, w, Tolerance::BF16);
        assert!(
            c.ok,
            "{} output {i}: engines differ by {}",
            call.name(),
            c.max_abs_error
        );
    }
    want
}

#[test]
fn forward_residual_and_backward_kernels_give_attention_and_its_gradients() {
    for causal in [false, true] {
        let (q, qa) = bf16s(1);
        let (k, ka) = bf16s(2);
        let (v, va) = bf16s(3);
        let (g, ga) = bf16s(4);
        let (o_ref, lse_ref, dq_ref, dk_ref, dv_ref) = reference(&q, &k, &v, &g, causal);
        let fwd = flash_attention_fwd(arr(), arr(), arr(), causal, BLOCK).expect("fwd builds");
        let outs = engines_agree(&fwd, &[qa.clone(), ka.clone(), va.clone()]);
        close(&format!("o (causal {causal})"), &outs[0], &o_ref);
        let lse = outs[1].as_slice::<f32>().expect("f32 lse");
        for (row, want) in lse_ref.iter().enumerate() {
            for lane in 0..128 {
                let got = lse[row * 128 + lane] as f64;
                assert!(
                    (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                    "lse row {row}: {got} vs {want}"
                );
            }
        }
        // the plain forward writes the same o, bit for bit
        let plain = flash_attention(arr(), arr(), arr(), causal, BLOCK).expect("builds");
        let o_plain = plain
            .interpret(&[qa.clone(), ka.clone(), va.clone()])
            .expect("runs");
        assert_eq!(o_plain[0].to_f64_vec(), outs[0].to_f64_vec());

        let residuals = [qa, ka, va, outs[0].clone(), outs[1].clone(), ga];
        let lse_t = ArrayType::new([BH, SEQ, 128], F32);
        let dkv = flash_attention_dkv(
            arr(),
            arr(),
            arr(),
            arr(),
            lse_t.clone(),
            arr(),
            causal,
            BLOCK,
        )
        .expect("dkv builds");
        let d = engines_agree(&dkv, &residuals);
        close(&format!("dk (causal {causal})"), &d[0], &dk_ref);
        close(&format!("dv (causal {causal})"), &d[1], &dv_ref);
        let dq = flash_attention_dq(arr(), arr(), arr(), arr(), lse_t, arr(), causal, BLOCK)
            .expect("dq builds");
        close(
            &format!("dq (causal {causal})"),
            &engines_agree(&dq, &residuals)[0],
            &dq_ref,
        );
    }
}

/// Causal: a skipped step's index map names the block the previous step fetched, so nothing is fetched
/// for it (the pipeline only copies when a block index changes).
#[test]
fn skipped_causal_steps_fetch_no_new_blocks() {
    let call = flash_attention(arr(), arr(), arr(), true, (64, 64)).expect("builds");
    let kernel = call.ir();
    let key = &kernel.operands[1];
    let blocks: Vec<Vec<i64>> = (0..4)
        .flat_map(|i| (0..4).map(move |j| vec![0, i, j]))
        .map(|p| {
            tpu_kernel::check::eval_index_map(&key.block.as_ref().expect("blocked").index_map, &p)
                .expect("evaluates")
        })
        .collect();
    // query block i (64 rows) needs key blocks 0..=i: later steps repeat block i
    for (n, b) in blocks.iter().enumerate() {
        let (i, j) = ((n / 4) as i64, (n % 4) as i64);
        assert_eq!(b, &vec![0, j.min(i), 0], "query block {i}, key step {j}");
    }
}

#[test]
fn shape_and_residual_mistakes_are_errors() {
    let e = flash_attention(
        arr(),
        ArrayType::new([BH, 128, D], BF16),
        arr(),
        false,
        BLOCK,
    )
    .expect_err("k shape");
    assert!(
        e.message
            .contains("k is [2, 128, 128] but q is [2, 256, 128]"),
        "{e}"
    );
    let e = flash_attention(arr(), arr(), arr(), false, (96, 128)).expect_err("block");
    assert!(
        e.message.contains("block (96, 128) must divide seq = 256"),
        "{e}"
    );
    let e = flash_attention_dq(arr(), arr(), arr(), arr(), arr(), arr(), false, BLOCK)
        .expect_err("lse");
    assert!(e.message.contains("lse is bf16[2, 256, 128]"), "{e}");
}

/// `#[export(fwd = ..)]` is checked against the library: the named kernel must be exported and take
/// the same arrays and static parameters.
#[test]
fn a_fwd_kernel_must_fit_its_kernel() {
    use tpu_kernel::__private::export::problems;
    let complete = vec![
        __tpu_kernel_export_flash_attention(),
        __tpu_kernel_export_flash_attention_fwd(),
        __tpu_kernel_export_flash_attention_dkv(),
        __tpu_kernel_export_flash_attention_dq(),
    ];
    assert_eq!(problems(&complete), Vec::<String>::new());
    let mut missing = complete.clone();
    missing.remove(1);
    let p = problems(&missing);
    assert!(p.len() == 1 && p[0].contains("runs `flash_attention_fwd` under differentiation, which this library does not export"), "{p:?}");
    // a fwd with other arrays and parameters (matmul's, renamed)
    let mut wrong = complete.clone();
    wrong[1] = matmul::__tpu_kernel_export_matmul();
    wrong[1].name = "flash_attention_fwd";
    let p = problems(&wrong);
    assert!(
        p.iter()
            .any(|m| m.contains("whose arrays (x, y) are not its own (q, k, v)")),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|m| m.contains("whose static parameters (block) are not its own (causal, block)")),
        "{p:?}"
    );
}
