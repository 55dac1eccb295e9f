//! Random launches (issue 13, item 2b): grids, array and block shapes up to `usize::MAX` (squeezed
//! dimensions included), dtypes, random affine index maps (out of range too), scratch buffers and VMEM
//! limits, through `build()`. Invariants: `build()` never panics and never reports an internal error;
//! every launch it accepts lowers to verified Mosaic, serializes to its `tpu_custom_call`, and — when
//! small enough to run — interprets without error on random inputs.
//!
//! CI runs 3,000 cases (seed 1; `TPU_KERNEL_FUZZ_LAUNCHES` sets the count); the long run:
//! `TPU_KERNEL_FUZZ_LAUNCHES=100000 cargo test --test fuzz_launches -- --nocapture` (about a minute;
//! last run: 100,000 cases, 42,910 accepted — all lowered and serialized, 42,410 small enough to
//! interpret and interpreted —, 57,090 rejected with located errors, 0 panics, 0 internal errors).
//! With `TPU_KERNEL_FUZZ_DUMP=dir` the accepted programs and the rejected launches libtpu can be asked
//! about are written there for `python/tests/test_fuzz_libtpu.py`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use tpu_kernel::prelude::*;
use tpu_kernel::runtime::interpret::HostArray;
use tpu_kernel::runtime::serialize::CustomCall;
use tpu_kernel::ErrorKind;

#[tpu_kernel]
fn copy_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load());
}

#[tpu_kernel]
fn copy_scratch_kernel(x: Ref<f32>, o: RefMut<f32>, _s: RefMut<f32>) {
    o.store(x.load());
}

#[tpu_kernel]
fn copy_bf16_kernel(x: Ref<bf16>, o: RefMut<bf16>) {
    o.store(x.load());
}

#[path = "common/rng.rs"]
mod rng;

use rng::Rng;

/// A dimension: mostly small and TPU-shaped, sometimes huge or hostile.
fn dim(r: &mut Rng) -> usize {
    match r.below(10) {
        0..=5 => r.pick(&[1, 2, 8, 16, 24, 128, 256, 384]),
        6 | 7 => 1 + r.below(300) as usize,
        8 => r.pick(&[1 << 31, 1 << 32, 1 << 40]),
        _ => r.pick(&[
            usize::MAX,
            usize::MAX - 1,
            i64::MAX as usize,
            i64::MAX as usize + 1,
        ]),
    }
}

/// A block dimension for an array dimension `a`.
fn block_dim(r: &mut Rng, a: usize) -> usize {
    match r.below(8) {
        0..=2 => a,
        3 => r.pick(&[8, 128, 256]),
        4 => 1,
        5 => a.saturating_sub(1).max(1),
        6 => 1 + (r.next() as usize % a.max(1)),
        _ => r.pick(&[0, usize::MAX, a.saturating_add(8)]),
    }
}

/// One affine index map term: `coef * grid[axis] + offset`.
#[derive(Clone, Copy)]
struct Term {
    axis: usize,
    coef: i32,
    offset: i64,
}

fn term(r: &mut Rng, grid_rank: usize) -> Term {
    Term {
        axis: r.below(grid_rank as u64) as usize,
        coef: r.pick(&[0, 1, 1, 1, 2, -1]),
        offset: match r.below(10) {
            0..=6 => 0,
            7 => 1,
            8 => -1,
            _ => r.pick(&[1 << 31, 1 << 32, i64::MAX]),
        },
    }
}

/// `coef * grid[axis] + offset` as the user would write it; an offset past i32 is a Rust `usize`
/// (rejected by the tracer at this line, never wrapped).
fn apply<const G: usize>(g: &[Scalar<i32>; G], t: Term) -> Scalar<i32> {
    let v = g[t.axis] * t.coef;
    match i32::try_from(t.offset) {
        Ok(c) => v + c,
        Err(_) => v + usize::try_from(t.offset).unwrap_or(usize::MAX),
    }
}

struct Launch {
    grid: Vec<usize>,
    dtype: DType,
    shape: Vec<usize>,
    block: Vec<usize>,
    squeeze: Vec<usize>,
    in_terms: Vec<Term>,
    out_terms: Vec<Term>,
    scratch: Option<Vec<usize>>,
    vmem_limit: Option<u64>,
}

/// A launch that should be accepted (tile-shaped arrays, dividing blocks, one grid axis per block
/// dimension, identity maps), then 0-3 random hostile mutations of its parts.
fn random_launch(r: &mut Rng) -> Launch {
    let rank = 1 + r.below(3) as usize;
    let shape: Vec<usize> = (0..rank)
        .map(|d| match (rank - d, r.below(3)) {
            (1, _) => r.pick(&[128, 256, 512]),
            (2, _) => r.pick(&[8, 16, 24, 64]),
            _ => r.pick(&[1, 2, 3]),
        })
        .collect();
    let block: Vec<usize> = shape
        .iter()
        .enumerate()
        .map(|(d, &a)| match rank - d {
            1 => r.pick(&[128, a]),
            2 => r.pick(&[8, a]),
            _ => r.pick(&[1, a]),
        })
        .collect();
    let grid: Vec<usize> = shape.iter().zip(&block).map(|(a, b)| a / b).collect();
    let identity: Vec<Term> = (0..rank)
        .map(|d| Term {
            axis: d,
            coef: 1,
            offset: 0,
        })
        .collect();
    let mut l = Launch {
        squeeze: (0..rank)
            .filter(|&d| block[d] == 1 && r.below(2) == 0)
            .collect(),
        grid,
        dtype: r.pick(&[F32, F32, BF16]),
        in_terms: identity.clone(),
        out_terms: identity,
        scratch: (r.below(4) == 0).then(|| vec![r.pick(&[8, 16]), 128]),
        vmem_limit: None,
        shape,
        block,
    };
    for _ in 0..r.below(4) {
        let d = r.below(rank as u64) as usize;
        match r.below(9) {
            0 => l.shape[d] = dim(r),
            1 => l.block[d] = block_dim(r, l.shape[d]),
            2 => {
                let g = r.below(l.grid.len() as u64) as usize;
                l.grid[g] = match r.below(3) {
                    0 => 0,
                    1 => r.pick(&[1 << 31, 1 << 20]),
                    _ => 1 + r.below(8) as usize,
                }
            }
            3 => l.in_terms[d] = term(r, rank),
            4 => l.out_terms[d] = term(r, rank),
            5 => l.squeeze.push(r.below(4) as usize),
            6 => l.scratch = Some((0..1 + r.below(2)).map(|_| dim(r)).collect()),
            7 => l.vmem_limit = Some(r.pick(&[0, 1024, 1 << 20, u64::MAX])),
            _ => l.dtype = r.pick(&[F32, BF16]),
        }
    }
    l
}

fn spec<'a, const G: usize, const R: usize>(l: &Launch, terms: &[Term]) -> BlockSpec<'a> {
    let terms = terms.to_vec();
    let shape: [usize; R] = l.block.clone().try_into().expect("rank R");
    let mut s = BlockSpec::new(shape, move |g: [Scalar<i32>; G]| -> [Scalar<i32>; R] {
        std::array::from_fn(|d| apply(&g, terms[d]))
    });
    for &d in &l.squeeze {
        s = s.squeeze(d);
    }
    s
}

fn build(l: &Launch) -> Result<PallasCall, KernelError> {
    macro_rules! with {
        ($g:literal, $r:literal) => {{
            let arr = ArrayType::new(l.shape.clone(), l.dtype);
            let (i, o) = (
                spec::<$g, $r>(l, &l.in_terms),
                spec::<$g, $r>(l, &l.out_terms),
            );
            macro_rules! finish {
                ($b:expr) => {
                    match l.vmem_limit {
                        Some(v) => $b.vmem_limit_bytes(v).build(),
                        None => $b.build(),
                    }
                };
            }
            match (l.dtype, &l.scratch) {
                (BF16, _) => finish!(pallas_call(copy_bf16_kernel)
                    .grid(l.grid.clone())
                    .input(arr.clone(), i)
                    .output(arr, o)),
                (_, None) => finish!(pallas_call(copy_kernel)
                    .grid(l.grid.clone())
                    .input(arr.clone(), i)
                    .output(arr, o)),
                (_, Some(s)) => finish!(pallas_call(copy_scratch_kernel)
                    .grid(l.grid.clone())
                    .input(arr.clone(), i)
                    .output(arr, o)
                    .scratch(Vmem::new(s.clone(), F32))),
            }
        }};
    }
    match (l.grid.len(), l.shape.len()) {
        (1, 1) => with!(1, 1),
        (1, 2) => with!(1, 2),
        (1, _) => with!(1, 3),
        (2, 1) => with!(2, 1),
        (2, 2) => with!(2, 2),
        (2, _) => with!(2, 3),
        (_, 1) => with!(3, 1),
        (_, 2) => with!(3, 2),
        (_, _) => with!(3, 3),
    }
}

/// The bytes of a launch's array (saturating).
fn array_bytes(l: &Launch) -> u64 {
    l.shape.iter().fold(l.dtype.size_bytes() as u64, |n, &d| {
        n.saturating_mul(d as u64)
    })
}

/// Whether libtpu can be asked about a launch at all: its array fits a chip's HBM, every dimension
/// (array, block, scratch) is below 2^31 with blocks under 4 GiB, and the grid has fewer than 2^31
/// steps — past that libtpu aborts the process ("overflow in static extent product", "Check failed:
/// llo::CouldLtS32") rather than answering.
fn sendable(l: &Launch) -> bool {
    let bytes = |dims: &[usize]| {
        dims.iter().fold(l.dtype.size_bytes() as u64, |n, &d| {
            n.saturating_mul(d as u64)
        })
    };
    let dims = l
        .shape
        .iter()
        .chain(&l.block)
        .chain(l.scratch.iter().flatten());
    let steps = l.grid.iter().fold(1u64, |n, &g| n.saturating_mul(g as u64));
    array_bytes(l) <= 4 << 30
        && steps < 1 << 31
        && dims.into_iter().all(|&d| d < 1 << 31)
        && bytes(&l.block) <= 4 << 30
        && l.scratch.as_deref().is_none_or(|s| bytes(s) <= 4 << 30)
}

/// A launch and our error as one line of JSON.
fn launch_json(l: &Launch, e: &KernelError) -> String {
    let terms = |t: &[Term]| -> Vec<[i64; 3]> {
        t.iter()
            .map(|t| [t.axis as i64, t.coef as i64, t.offset])
            .collect()
    };
    let v = serde_json::json!({
        "grid": l.grid,
        "dtype": l.dtype.to_string(),
        "shape": l.shape,
        "block": l.block,
        "squeeze": l.squeeze,
        "in_terms": terms(&l.in_terms),
        "out_terms": terms(&l.out_terms),
        "scratch": l.scratch,
        "vmem_limit": l.vmem_limit,
        "kind": format!("{:?}", e.kind),
        "error": e.message,
    });
    format!("{v}\n")
}

#[derive(Default, Debug)]
struct Counts {
    cases: usize,
    accepted: usize,
    interpreted: usize,
    rejected: usize,
}

fn run(cases: usize, seed: u64) -> Counts {
    let mut r = Rng(seed);
    let mut n = Counts::default();
    for case in 0..cases {
        let l = random_launch(&mut r);
        n.cases += 1;
        let what = || {
            format!(
                "case {case} (seed {seed}): grid {:?} {} array {:?} block {:?} squeeze {:?} scratch {:?} vmem {:?}",
                l.grid, l.dtype, l.shape, l.block, l.squeeze, l.scratch, l.vmem_limit
            )
        };
        let built = catch_unwind(AssertUnwindSafe(|| build(&l)))
            .unwrap_or_else(|_| panic!("build() panicked: {}", what()));
        let call = match built {
            Err(e) => {
                assert_ne!(e.kind, ErrorKind::Internal, "{}: {e}", what());
                assert!(e.location.is_some(), "{}: unlocated error {e}", what());
                n.rejected += 1;
                // The rejected launch as data, for the same launch written in Pallas and sent through
                // libtpu (python/tests/test_fuzz_libtpu.py): does the real toolchain reject it too?
                if let (Ok(dir), true) = (std::env::var("TPU_KERNEL_FUZZ_DUMP"), sendable(&l)) {
                    let path = std::path::Path::new(&dir).join(format!("reject_{case:06}.json"));
                    std::fs::write(&path, launch_json(&l, &e))
                        .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
                }
                continue;
            }
            Ok(c) => c,
        };
        n.accepted += 1;
        call.mosaic_mlir()
            .unwrap_or_else(|e| panic!("{}: accepted but does not lower: {e}", what()));
        let hlo = CustomCall::new(call.ir())
            .stablehlo()
            .unwrap_or_else(|e| panic!("{}: accepted but does not serialize: {e}", what()));
        // `TPU_KERNEL_FUZZ_DUMP=dir`: the accepted programs for libtpu (python/tests/test_fuzz_libtpu.py)
        // (Only launches whose two arrays fit a chip's HBM: past it libtpu refuses the program for
        // want of memory on that chip, which is the caller's array, not a kernel rule.)
        let fits_hbm = array_bytes(&l) <= 4 << 30;
        if let (Ok(dir), true) = (std::env::var("TPU_KERNEL_FUZZ_DUMP"), fits_hbm) {
            let path = std::path::Path::new(&dir).join(format!("accept_{case:06}.mlir"));
            std::fs::write(&path, format!("// {}\n{hlo}", what()))
                .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        }
        let bytes: usize = l.shape.iter().product::<usize>() * l.dtype.size_bytes();
        let steps: usize = l.grid.iter().product();
        if bytes <= 1 << 20 && steps <= 64 {
            let inputs: Vec<HostArray> = call
                .ir()
                .inputs()
                .enumerate()
                .map(|(i, o)| HostArray::random(&o.shape, o.dtype, seed ^ i as u64).expect("small"))
                .collect();
            call.interpret(&inputs)
                .unwrap_or_else(|e| panic!("{}: accepted but does not interpret: {e}", what()));
            n.interpreted += 1;
        }
    }
    n
}

#[test]
fn random_launches_never_panic_and_every_accept_lowers_serializes_and_runs() {
    let cases = std::env::var("TPU_KERNEL_FUZZ_LAUNCHES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let n = run(cases, 1);
    println!("fuzz_launches: {n:?}");
    // the generator reaches both sides (a fuzzer that only rejects tests nothing)
    assert!(n.accepted * 5 >= n.cases, "{n:?}");
    assert!(n.rejected * 5 >= n.cases, "{n:?}");
    assert!(n.interpreted * 10 >= n.cases, "{n:?}");
}
