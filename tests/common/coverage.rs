//! The op-coverage kernels: between them they reach every lowering rule and, per rule, every dtype
//! class that picks a different Mosaic op. `tests/bytecode.rs` holds their serialized bodies to the
//! reference serializer; `tests/mosaic_cpu.rs` runs their Mosaic on the CPU against the interpreter.

use std::path::{Path, PathBuf};
use tpu_kernel::prelude::*;

/// The lowering's rule sources: `lower/rules.rs` and every `.rs` file under `lower/rules/` (read at
/// run time, so a rules file added later is scanned without editing the tests).
pub fn rule_sources() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let lower = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernel-runtime/src/lower");
    let mut files = vec![lower.join("rules.rs")];
    walk(&lower.join("rules"), &mut files);
    files
}

/// The quoted `dialect.op` names of a Rust source text (`"tpu.matmul"`, `"arith.addf"`, ...).
pub fn quoted_op_names(text: &str) -> Vec<String> {
    text.split('"')
        .filter(|s| {
            let d = s.split('.').next().unwrap_or("");
            ["arith", "math", "memref", "vector", "tpu", "scf", "func"].contains(&d)
                && s.contains('.')
                && !s.contains(char::is_whitespace)
        })
        .map(str::to_string)
        .collect()
}

/// Every op name the rule sources ([`rule_sources`]) emit, sorted, without repeats.
pub fn rule_op_names() -> Vec<String> {
    let mut names: Vec<String> = rule_sources()
        .iter()
        .flat_map(|p| {
            let text =
                std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            quoted_op_names(&text)
        })
        .collect();
    names.sort();
    names.dedup();
    names
}
/// Every Mosaic op name the lowering can emit: the literals of its rule sources ([`rule_op_names`])
/// and the lowering's column of the op table for every row of the op enums (`UnaryOp::ALL`,
/// `BinaryOp::ALL`, per dtype class) — so a row added to the table is in the list.
#[allow(dead_code)] // not every test crate that includes `common` checks coverage
pub fn lowering_op_names() -> Vec<String> {
    use tpu_kernel::runtime::ir::{BinaryOp, UnaryOp};
    use tpu_kernel::runtime::lower::{
        mosaic_binary, mosaic_unary_float, mosaic_unary_int, IntLowering,
    };
    let mut names = rule_op_names();
    for u in UnaryOp::ALL {
        names.extend(mosaic_unary_float(*u).map(str::to_string));
        if let IntLowering::Op(n) = mosaic_unary_int(*u) {
            names.push(n.to_string());
        }
    }
    for b in BinaryOp::ALL {
        names.extend(
            [DType::F32, DType::I32, DType::U32]
                .iter()
                .filter_map(|d| mosaic_binary(*b, *d))
                .map(str::to_string),
        );
    }
    names.sort();
    names.dedup();
    names
}

// Between them, these kernels reach every lowering rule and, per rule, every dtype class that picks a
// different Mosaic op, so every op name (and its inherent attributes) the lowering can emit is checked.

#[tpu_kernel]
fn float_kernel(x: Ref<f32>, y: Ref<f32>, o: RefMut<f32>, b: RefMut<bf16>, m: RefMut<i32>) {
    let (a, c) = (x.load(), y.load());
    let u = -a + a.exp() + a.log() + a.tanh() + a.rsqrt() + a.sqrt() + a.sin() + a.cos() + a.abs();
    let u = u + a.erf() + a.log1p() + a.logistic() + a.floor() + a.ceil() + a.round();
    let v = (a - c) * (a / c) + a % c + maximum(a, c) + minimum(a, c) + pow(a, c);
    let lt = a < c;
    let le = a <= c;
    let gt = a > c;
    let ge = a >= c;
    let eq = a == c;
    let ne = a != c;
    let k = (lt & le) | (gt ^ ge) | !(eq | ne);
    o.store(select(k, u, v) + k.cast::<f32>() + a.cast::<bool>().cast::<f32>());
    b.store(u.cast::<bf16>() + b.load());
    m.store(v.cast::<i32>() + a.cast::<u32>().cast::<i32>());
}

#[tpu_kernel]
fn int_kernel(
    x: Ref<i32>,
    y: Ref<i32>,
    u: Ref<u32>,
    o: RefMut<i32>,
    f: RefMut<f32>,
    q: RefMut<u32>,
) {
    let (a, c, w) = (x.load(), y.load(), u.load());
    let z = c.cast::<u32>();
    let s = -a + a.abs() + (a - c) * (a / c) + a % c + maximum(a, c) + minimum(a, c);
    let bits = (a & c) | (a ^ c);
    let k = (a < c) | (a <= c) | (a > c) | (a >= c) | (a == c) | (a != c);
    let uk = (w < z) | (w <= z) | (w > z) | (w >= z);
    let narrow = a.cast::<i8>().cast::<i32>() + w.cast::<u8>().cast::<i32>() + k.cast::<i32>();
    o.store(select(uk, s + bits, narrow) + a.cast::<bool>().cast::<i32>() + (a << 2) + (a >> 1));
    f.store(a.cast::<f32>() + w.cast::<f32>() + k.cast::<f32>());
    q.store(w / z + w % z + maximum(w, z) + minimum(w, z) + a.cast::<u32>() + (w >> 3) + (w << 2));
}

#[tpu_kernel]
fn reduce_kernel(
    x: Ref<f32>,
    i: Ref<i32>,
    u: Ref<u32>,
    o: RefMut<f32>,
    oi: RefMut<i32>,
    ou: RefMut<u32>,
) {
    let (a, b, c) = (x.load(), i.load(), u.load());
    let rows = a.sum_keepdims(1) + a.max_keepdims(1) + a.min_keepdims(1);
    let cols = a.sum_keepdims(0) + a.max_keepdims(0) + a.min_keepdims(0);
    let all = a.sum(1).sum(0);
    o.store(
        rows.broadcast_to([8, 128]) + cols.broadcast_to([8, 128]) + all + a.mean(1).reshape([8, 1]),
    );
    oi.store(b.sum_keepdims(0).broadcast_to([8, 128]) + b.max_keepdims(1) + b.min_keepdims(1));
    ou.store(c.sum_keepdims(0).broadcast_to([8, 128]) + c.max_keepdims(1) + c.min_keepdims(1));
}

#[tpu_kernel]
fn dot_kernel(x: Ref<bf16>, y: Ref<bf16>, q: Ref<i8>, o: RefMut<f32>, oi: RefMut<i32>) {
    let (a, b) = (x.load(), y.load());
    o.store(dot(a, b) + dot_nt(a, b) + dot_tn(a, b) + a.cast::<f32>().t());
    oi.store(dot(q.load(), q.load()));
}

#[tpu_kernel]
fn shape_kernel(x: Ref<f32>, o: RefMut<f32>, row: RefMut<f32>) {
    let i = program_id(0);
    let first = x.at((0, ..)).load();
    let cols = iota::<i32>([8, 128], 1);
    let t = x.load().transpose([1, 0]).transpose([1, 0]);
    o.store(t + first.reshape([1, 128]).broadcast_to([8, 128]));
    o.store_masked(t * 2.0, cols < 64);
    row.at((0, ..)).store(first);
    for j in 0..4 {
        let band = o.at((ds(multiple_of(j * 2, 2), 2), ..));
        band.store(band.load() + 1.0);
    }
    let mut n = scalar(0i32);
    while n < i + 2 {
        n += 1;
    }
    let v = if i % 2 == 0 { t * 2.0 } else { t };
    // Bool scalar constants (MLIR's typed bool attribute).
    if (n > 3) & scalar(true) | scalar(false) {
        o.store(v);
    }
}

#[tpu_kernel]
fn shift_kernel(x: Ref<i32>, n: Ref<i32>, u: Ref<u32>, o: RefMut<i32>, q: RefMut<u32>) {
    let (a, s, w) = (x.load(), n.load(), u.load());
    {
        let _scope = named_scope("shifts");
        o.store((a << s) + (a >> s) + (a << 3));
    }
    q.store((w >> s.cast::<u32>()) + (w << 3));
}

#[tpu_kernel]
fn dma_kernel(x_hbm: Ref<f32, Any>, o: RefMut<f32>, buf: RefMut<f32>, sems: DmaSem, s: Sem) {
    let i = program_id(0);
    let c = async_copy(x_hbm.at(ds(i * 8, 8)), buf.at(1), sems.at(1));
    c.start();
    c.wait();
    s.signal(2);
    s.wait(1);
    let left = s.read();
    s.wait(1);
    o.store(buf.at(1).load() + left.cast::<f32>());
}

#[tpu_kernel]
fn slice_kernel(x: Ref<f32>, b: Ref<bf16>, o: RefMut<f32>, ob: RefMut<bf16>) {
    let (a, h) = (x.load(), b.load());
    // Unaligned lanes and sublanes, a whole-tile window, and an index that drops a dimension.
    let lanes = a.slice((.., 1..2)).broadcast_to([8, 128]) + a.slice((.., ..1));
    let rows = a.slice((3..4, ..)).broadcast_to([8, 128]) + a.slice((0, ..)).reshape([1, 128]);
    o.store(lanes + rows + a.slice((.., 64..)).slice((.., 63..)).broadcast_to([8, 128]));
    ob.store(
        h.slice((2..10, ..))
            .slice((.., 5..6))
            .broadcast_to([8, 128])
            + h.slice((8..16, ..)),
    );
}

/// Values from values: a select on a scalar condition, a traced fill, `tpu.concatenate` on lanes and
/// sublanes, `tpu.dynamic_rotate` by a constant and a traced amount, `tpu.reduce_index` both kinds.
#[tpu_kernel]
fn values_kernel(x: Ref<f32>, o: RefMut<f32>, idx: RefMut<i32>) {
    let a = x.load(); // [16, 256]
    let i = program_id(0);
    let b = select(i == 1, a, a * 0.5) + full([16, 256], i).cast::<f32>();
    let lanes = concatenate((b.slice((.., 128..)), b.slice((.., ..128))), 1);
    let rows = concatenate([b.slice((8.., ..)), b.slice((..8, ..))], 0);
    o.store(roll(lanes, 5, 1) + roll(rows, i + 3, 0));
    let m = a.argmax(1).reshape([16, 1]).broadcast_to([16, 256]);
    idx.store(m + a.argmin(0).reshape([1, 256]).broadcast_to([16, 256]));
}

/// Strided windows: `tpu.strided_load` and `tpu.strided_store` (stride 2 and 3 along sublanes).
/// Ref views and value bitcasts: `tpu.memref_bitcast`, `tpu.memref_reshape`, `tpu.bitcast`.
#[tpu_kernel]
fn views_kernel(x: Ref<bf16>, y: Ref<f32>, o: RefMut<u32>, s: RefMut<f32>, f: RefMut<f32>) {
    o.store(x.bitcast::<u32>().load() + x.load().bitcast::<u32>());
    s.reshape([2, 8, 128])
        .store(y.load().reshape([2, 8, 128]) * 2.0f32);
    f.store(y.reshape([2, 8, 128]).at(1).load() + s.at(0..8).load());
}

#[tpu_kernel]
fn strided_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.at((ds(0, 8).stride(2), ..)).load());
    o.at((ds(1, 3).stride(3), ..))
        .store(x.at((ds(program_id(0), 3).stride(5), ..)).load() * 2.0);
}

/// SMEM: a scalar-prefetch table read by an index map and by the body (`memref.load`), a 2-D SMEM
/// scratch written and read (`memref.store`, `memref.load`).
#[tpu_kernel]
fn smem_kernel(t: Ref<i32, Smem>, x: Ref<f32>, o: RefMut<f32>, cells: RefMut<i32, Smem>) {
    let i = program_id(0);
    cells.at((1, i)).store(t.at(i).load() + i);
    let sum: Scalar<i32> = cells.at((1, 0)).load() + cells.at((1, i)).load();
    o.store(x.load() * sum.cast::<f32>());
}

/// The body of `scoped_kernel`'s scope: DMA into and out of a scoped VMEM buffer, a scoped SMEM cell
/// stored and loaded, a scoped regular semaphore signalled and waited for, inside a named region.
#[kernel_fn]
fn scoped_body(
    x: Ref<f32>,
    o: RefMut<f32>,
    buf: RefMut<f32>,
    cell: RefMut<i32, Smem>,
    copy: DmaSem,
    s: Sem,
) {
    let _scope = named_scope("staged");
    cell.at(0).store(program_id(0) + 2);
    sync_copy(x, buf, copy);
    s.signal(3);
    s.wait(2);
    let left = s.read();
    s.wait(1);
    buf.store(buf.load() * cell.at(0).load().cast::<f32>() + left.cast::<f32>());
    sync_copy(buf, o, copy);
}

/// `run_scoped` with every kind of scoped allocation (`tpu.region`, `memref.alloca` in VMEM and SMEM,
/// `tpu.sem_alloc` of both semaphore kinds, `tpu.yield`).
#[tpu_kernel]
fn scoped_kernel(x: Ref<f32>, o: RefMut<f32>) {
    run_scoped(
        scoped_body,
        (x, o),
        (
            Vmem::new([8, 128], F32),
            Smem::new([1], I32),
            DmaSem::one(),
            Sem::one(),
        ),
    );
}

/// The coverage kernels, built: (name, call).
pub fn calls() -> Vec<(&'static str, PallasCall)> {
    let ty = |s: [usize; 2], d| ArrayType::new(s, d);
    let spec = |s: [usize; 2]| BlockSpec::new(s, |[i]| (i, 0));
    let one = |name: &'static str, r: Result<PallasCall, KernelError>| {
        (name, r.unwrap_or_else(|e| panic!("{name} builds: {e}")))
    };
    let b = [8, 128];
    vec![
        one(
            "dma",
            pallas_call(dma_kernel)
                .grid([2])
                .input_any(ty([16, 128], F32))
                .output(ty([16, 128], F32), spec(b))
                .scratch(Vmem::new([2, 8, 128], F32))
                .scratch(DmaSem::array([2]))
                .scratch(Sem::one())
                .build(),
        ),
        one(
            "strided",
            pallas_call(strided_kernel)
                .grid([2])
                .input(ty([32, 128], F32), spec([16, 128]))
                .output(ty([16, 128], F32), spec(b))
                .build(),
        ),
        one(
            "float",
            pallas_call(float_kernel)
                .grid([2])
                .input(ty([16, 128], F32), spec(b))
                .input(ty([16, 128], F32), spec(b))
                .output(ty([16, 128], F32), spec(b))
                .output(ty([16, 128], BF16), spec(b))
                .output(ty([16, 128], I32), spec(b))
                .build(),
        ),
        one(
            "int",
            pallas_call(int_kernel)
                .grid([2])
                .input(ty([16, 128], I32), spec(b))
                .input(ty([16, 128], I32), spec(b))
                .input(ty([16, 128], U32), spec(b))
                .output(ty([16, 128], I32), spec(b))
                .output(ty([16, 128], F32), spec(b))
                .output(ty([16, 128], U32), spec(b))
                .build(),
        ),
        one(
            "reduce",
            pallas_call(reduce_kernel)
                .grid([2])
                .input(ty([16, 128], F32), spec(b))
                .input(ty([16, 128], I32), spec(b))
                .input(ty([16, 128], U32), spec(b))
                .output(ty([16, 128], F32), spec(b))
                .output(ty([16, 128], I32), spec(b))
                .output(ty([16, 128], U32), spec(b))
                .build(),
        ),
        one(
            "dot",
            pallas_call(dot_kernel)
                .grid([1])
                .input(ty([128, 128], BF16), spec([128, 128]))
                .input(ty([128, 128], BF16), spec([128, 128]))
                .input(ty([128, 128], I8), spec([128, 128]))
                .output(ty([128, 128], F32), spec([128, 128]))
                .output(ty([128, 128], I32), spec([128, 128]))
                .build(),
        ),
        one(
            "shape",
            pallas_call(shape_kernel)
                .grid([2])
                .input(ty([16, 128], F32), spec(b))
                .output(ty([16, 128], F32), spec(b))
                .output(ty([16, 128], F32), spec(b))
                .build(),
        ),
        one(
            "slice",
            pallas_call(slice_kernel)
                .grid([2])
                .input(ty([16, 128], F32), spec(b))
                .input(ty([32, 128], BF16), spec([16, 128]))
                .output(ty([16, 128], F32), spec(b))
                .output(ty([16, 128], BF16), spec(b))
                .build(),
        ),
        one(
            "smem",
            pallas_call(smem_kernel)
                .grid([2])
                .scalar_prefetch(ArrayType::new([2], I32))
                .input(
                    ty([16, 128], F32),
                    BlockSpec::with_prefetch(b, |[i], [t]| (t.at(i).load(), 0)),
                )
                .output(ty([16, 128], F32), spec(b))
                .scratch(Smem::new([2, 2], I32))
                .build(),
        ),
        one(
            "scoped",
            pallas_call(scoped_kernel)
                .grid([2])
                .input(ty([16, 128], F32), spec(b))
                .output(ty([16, 128], F32), spec(b))
                .build(),
        ),
        one(
            "values",
            pallas_call(values_kernel)
                .grid([2])
                .input(ty([32, 256], F32), spec([16, 256]))
                .output(ty([32, 256], F32), spec([16, 256]))
                .output(ty([32, 256], I32), spec([16, 256]))
                .build(),
        ),
        one(
            "views",
            pallas_call(views_kernel)
                .grid([2])
                .input(ty([32, 128], BF16), spec([16, 128]))
                .input(ty([32, 128], F32), spec([16, 128]))
                .output(ty([16, 128], U32), spec(b))
                .output(ty([32, 128], F32), spec([16, 128]))
                .output(ty([16, 128], F32), spec(b))
                .build(),
        ),
        one(
            "shift",
            pallas_call(shift_kernel)
                .grid([2])
                .input(ty([16, 128], I32), spec(b))
                .input(ty([16, 128], I32), spec(b))
                .input(ty([16, 128], U32), spec(b))
                .output(ty([16, 128], I32), spec(b))
                .output(ty([16, 128], U32), spec(b))
                .build(),
        ),
    ]
}
