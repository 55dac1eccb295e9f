//! A crate outside the examples that exports kernels to Python, as a user's would: the README's
//! example (`scale`, differentiable through itself), kernels the Python suite uses for error paths
//! (`bad_rows` reads out of bounds at run time), and `by_target`, whose blocks follow the TPU
//! generation it is built for; the narrow dtypes at the boundary (`quantize`, `dequantize`,
//! `fp8_weight_matmul`, and `f16_to_f32`, which every generation refuses; int4's `to_int4`,
//! `from_int4`, `int4_dot`, `int4_weight_matmul`).

use tpu_kernel::prelude::*;

#[tpu_kernel]
fn scale_kernel(x: Ref<f32>, o: RefMut<f32>, factor: f32) {
    o.store(x.load() * factor);
}

/// `x * factor` for an f32 `[m, n]` array, 8 rows per step; its gradient is `g * factor`.
#[export(grad(x = scale(g, factor = factor)))]
pub fn scale(x: ArrayType, factor: f32) -> Result<PallasCall, KernelError> {
    let [m, n] = x.dims()?;
    let rows = || BlockSpec::new([8, n], |[i]| (i, 0));
    pallas_call(move |x: Ref<f32>, o: RefMut<f32>| scale_kernel(x, o, factor))
        .grid([x.blocks(0, 8)?])
        .input(x, rows())
        .output(ArrayType::new([m, n], F32), rows())
        .build()
}

#[tpu_kernel]
fn bad_rows_kernel(x: Ref<f32>, o: RefMut<f32>) {
    // Block rows 8·i .. 8·i + 8 of an 8-row block: in bounds only at i = 0.
    let start = multiple_of(program_id(0) * 8, 8);
    o.store(x.at((ds(start, 8), ..)).load());
}

/// A kernel that is only wrong at run time: every grid step but the first reads past its block.
#[export]
pub fn bad_rows(x: ArrayType) -> Result<PallasCall, KernelError> {
    let [m, n] = x.dims()?;
    let rows = || BlockSpec::new([8, n], |[i]| (i, 0));
    pallas_call(bad_rows_kernel)
        .grid([x.blocks(0, 8)?])
        .input(x, rows())
        .output(ArrayType::new([m, n], F32), rows())
        .build()
}

#[tpu_kernel]
fn copy_kernel(x: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load());
}

/// `x` copied in blocks of the MXU's size in rows (128 on v4/v5e/v5p, 256 on v6e/tpu7x), the kernel
/// named after the generation it is built for (`copy_v6e`): how a launch function reads its target.
#[export]
pub fn by_target(x: ArrayType, target: Target) -> Result<PallasCall, KernelError> {
    let [m, n] = x.dims()?;
    let rows = target.info().mxu_size.min(m);
    let spec = || BlockSpec::new([rows, n], |[i]| (i, 0));
    pallas_call(copy_kernel)
        .name(format!("copy_{target}"))
        .grid([x.blocks(0, rows)?])
        .input(x, spec())
        .output(ArrayType::new([m, n], F32), spec())
        .build()
}

/// Kernels in a module of their own, listed in `export_library!` by a `use`d name.
mod elsewhere {
    use tpu_kernel::prelude::*;

    #[tpu_kernel]
    fn negate_kernel(x: Ref<f32>, o: RefMut<f32>) {
        o.store(-x.load());
    }

    /// `-x` for an f32 `[m, n]` array, 8 rows per step.
    #[export]
    pub fn negate(x: ArrayType) -> Result<PallasCall, KernelError> {
        let [m, n] = x.dims()?;
        let rows = || BlockSpec::new([8, n], |[i]| (i, 0));
        pallas_call(negate_kernel)
            .grid([x.blocks(0, 8)?])
            .input(x, rows())
            .output(ArrayType::new([m, n], F32), rows())
            .build()
    }
}
use elsewhere::negate;

#[tpu_kernel]
fn whole_add_kernel(x: Ref<f32>, y: Ref<f32>, o: RefMut<f32>) {
    o.store(x.load() + y.load());
}

/// `x + y` in one grid-free launch: whole-array blocks and no grid, as Pallas's grid-free
/// `pallas_call` (its Mosaic has no iteration bounds and no windows).
#[export]
pub fn whole_add(x: ArrayType, y: ArrayType) -> Result<PallasCall, KernelError> {
    let [m, n] = x.dims()?;
    let whole = || BlockSpec::new([m, n], |[]| (0, 0));
    let (bx, by, bo) = (whole(), whole(), whole());
    let out = ArrayType::new([m, n], F32);
    pallas_call(whole_add_kernel)
        .input(x, bx)
        .input(y, by)
        .output(out, bo)
        .build()
}

tpu_kernel::export_library!(
    "user_crate",
    [
        negate,
        whole_add,
        scale,
        bad_rows,
        by_target,
        quantize,
        dequantize,
        fp8_weight_matmul,
        fp8_dot,
        f16_to_f32,
        to_int4,
        from_int4,
        int4_dot,
        int4_weight_matmul,
        int4_copy_1d,
        int4_dma_rows,
        int4_unsigned
    ]
);

#[tpu_kernel]
fn quantize_e4m3(x: Ref<f32>, o: RefMut<f8e4m3fn>) {
    o.store(x.load().cast::<f8e4m3fn>());
}

#[tpu_kernel]
fn quantize_e5m2(x: Ref<f32>, o: RefMut<f8e5m2>) {
    o.store(x.load().cast::<f8e5m2>());
}

#[tpu_kernel]
fn dequantize_e4m3(x: Ref<f8e4m3fn>, o: RefMut<f32>, b: RefMut<bf16>) {
    o.store(x.load().cast::<f32>());
    b.store(x.load().cast::<bf16>());
}

#[tpu_kernel]
fn dequantize_e5m2(x: Ref<f8e5m2>, o: RefMut<f32>, b: RefMut<bf16>) {
    o.store(x.load().cast::<f32>());
    b.store(x.load().cast::<bf16>());
}

fn rows_of(n: usize) -> BlockSpec<'static> {
    BlockSpec::new([8, n], |[i]| (i, 0))
}

/// An f32 `[m, n]` array rounded to `float8_e4m3fn` (or `float8_e5m2` with `e5m2`), 8 rows a step.
#[export]
pub fn quantize(x: ArrayType, #[default(false)] e5m2: bool) -> Result<PallasCall, KernelError> {
    let [m, n] = x.dims()?;
    let grid = [x.blocks(0, 8)?];
    if e5m2 {
        pallas_call(quantize_e5m2)
            .grid(grid)
            .input(x, rows_of(n))
            .output(ArrayType::new([m, n], F8E5M2), rows_of(n))
            .build()
    } else {
        pallas_call(quantize_e4m3)
            .grid(grid)
            .input(x, rows_of(n))
            .output(ArrayType::new([m, n], F8E4M3FN), rows_of(n))
            .build()
    }
}

/// An 8-bit float `[m, n]` array (either kind) as f32 and as bf16.
#[export]
pub fn dequantize(x: ArrayType) -> Result<PallasCall, KernelError> {
    let [m, n] = x.dims()?;
    let grid = [x.blocks(0, 8)?];
    let f32_out = ArrayType::new([m, n], F32);
    let bf16_out = ArrayType::new([m, n], BF16);
    match x.dtype {
        F8E5M2 => pallas_call(dequantize_e5m2)
            .grid(grid)
            .input(x, rows_of(n))
            .output(f32_out, rows_of(n))
            .output(bf16_out, rows_of(n))
            .build(),
        _ => pallas_call(dequantize_e4m3)
            .grid(grid)
            .input(x, rows_of(n))
            .output(f32_out, rows_of(n))
            .output(bf16_out, rows_of(n))
            .build(),
    }
}

#[tpu_kernel]
fn fp8_weight_matmul_kernel(x: Ref<bf16>, w: Ref<f8e4m3fn>, scale: Ref<f32>, o: RefMut<f32>) {
    let acc = dot(x.load(), w.load().cast::<bf16>());
    o.store(acc * scale.load());
}

/// `(x @ dequantize(w)) * scale`: bf16 activations `[m, k]`, `float8_e4m3fn` weights `[k, n]`
/// dequantized to bf16 in the kernel, an f32 scale per output column `[1, n]`; 128-row blocks.
#[export]
pub fn fp8_weight_matmul(
    x: ArrayType,
    w: ArrayType,
    scale: ArrayType,
) -> Result<PallasCall, KernelError> {
    let [m, k] = x.dims()?;
    let [_, n] = w.dims()?;
    let bm = m.min(128);
    pallas_call(fp8_weight_matmul_kernel)
        .grid([x.blocks(0, bm)?])
        .input(x, BlockSpec::new([bm, k], |[i]| (i, 0)))
        .input(w, BlockSpec::new([k, n], |[_i]| (0, 0)))
        .input(scale, BlockSpec::new([1, n], |[_i]| (0, 0)))
        .output(
            ArrayType::new([m, n], F32),
            BlockSpec::new([bm, n], |[i]| (i, 0)),
        )
        .build()
}

#[tpu_kernel]
fn fp8_dot_e4m3(x: Ref<f8e4m3fn>, w: Ref<f8e4m3fn>, o: RefMut<f32>) {
    o.store(dot(x.load(), w.load()));
}

#[tpu_kernel]
fn fp8_dot_e5m2(x: Ref<f8e5m2>, w: Ref<f8e5m2>, o: RefMut<f32>) {
    o.store(dot(x.load(), w.load()));
}

/// `x @ w` of two 8-bit float arrays of one kind, accumulated in f32 (one block; refused on v4).
#[export]
pub fn fp8_dot(x: ArrayType, w: ArrayType) -> Result<PallasCall, KernelError> {
    let ([m, k], [_, n]) = (x.dims()?, w.dims()?);
    let out = ArrayType::new([m, n], F32);
    let (bx, bw, bo) = (
        BlockSpec::new([m, k], |[_i]| (0, 0)),
        BlockSpec::new([k, n], |[_i]| (0, 0)),
        BlockSpec::new([m, n], |[_i]| (0, 0)),
    );
    match x.dtype {
        F8E5M2 => pallas_call(fp8_dot_e5m2)
            .grid([1])
            .input(x, bx)
            .input(w, bw)
            .output(out, bo)
            .build(),
        _ => pallas_call(fp8_dot_e4m3)
            .grid([1])
            .input(x, bx)
            .input(w, bw)
            .output(out, bo)
            .build(),
    }
}

#[tpu_kernel]
fn f16_to_f32_kernel(x: Ref<f16>, o: RefMut<f32>) {
    o.store(x.load().cast::<f32>());
}

/// An f16 array widened to f32: refused at build on every generation (libtpu compiles no f16 vector).
#[export]
pub fn f16_to_f32(x: ArrayType) -> Result<PallasCall, KernelError> {
    let [m, n] = x.dims()?;
    pallas_call(f16_to_f32_kernel)
        .grid([x.blocks(0, 8)?])
        .input(x, rows_of(n))
        .output(ArrayType::new([m, n], F32), rows_of(n))
        .build()
}

/// Blocks of 8 rows when the rows divide so, else the whole array (any shape, odd element counts
/// included: the XLA boundary packs int4 two per byte): (grid steps, block rows).
fn int4_rows(m: usize) -> (usize, usize) {
    let rows = if m.is_multiple_of(8) { 8 } else { m };
    (m / rows, rows)
}

fn rows_block(rows: usize, n: usize) -> BlockSpec<'static> {
    BlockSpec::new([rows, n], |[i]| (i, 0))
}

#[tpu_kernel]
fn f32_to_int4(x: Ref<f32>, o: RefMut<i4>, b: RefMut<i4>) {
    o.store(x.load().cast::<i4>());
    b.store(x.load().cast::<bf16>().cast::<i4>());
}

#[tpu_kernel]
fn i32_to_int4(x: Ref<i32>, o: RefMut<i4>, b: RefMut<i4>) {
    o.store(x.load().cast::<i4>());
    b.store(x.load().cast::<i8>().cast::<i4>());
}

/// `x` (f32 or i32 `[m, n]`) cast to int4, directly and through bf16 (f32) or i8 (i32): floats
/// round toward zero and saturate, integers wrap.
#[export]
pub fn to_int4(x: ArrayType) -> Result<PallasCall, KernelError> {
    let [m, n] = x.dims()?;
    let (steps, rows) = int4_rows(m);
    let out = ArrayType::new([m, n], I4);
    macro_rules! launch {
        ($k:expr) => {
            pallas_call($k)
                .grid([steps])
                .input(x, rows_block(rows, n))
                .output(out.clone(), rows_block(rows, n))
                .output(out, rows_block(rows, n))
                .build()
        };
    }
    match x.dtype {
        I32 => launch!(i32_to_int4),
        _ => launch!(f32_to_int4),
    }
}

#[tpu_kernel]
fn from_int4_kernel(
    x: Ref<i4>,
    f: RefMut<f32>,
    b: RefMut<bf16>,
    i: RefMut<i32>,
    j: RefMut<i8>,
    c: RefMut<i4>,
) {
    let v = x.load();
    f.store(v.cast::<f32>());
    b.store(v.cast::<bf16>());
    i.store(v.cast::<i32>());
    j.store(v.cast::<i8>());
    c.store(v);
}

/// An int4 `[m, n]` array widened to f32, bf16, i32 and i8, and copied (an int4 output).
#[export]
pub fn from_int4(x: ArrayType) -> Result<PallasCall, KernelError> {
    let [m, n] = x.dims()?;
    let (steps, rows) = int4_rows(m);
    pallas_call(from_int4_kernel)
        .grid([steps])
        .input(x, rows_block(rows, n))
        .output(ArrayType::new([m, n], F32), rows_block(rows, n))
        .output(ArrayType::new([m, n], BF16), rows_block(rows, n))
        .output(ArrayType::new([m, n], I32), rows_block(rows, n))
        .output(ArrayType::new([m, n], I8), rows_block(rows, n))
        .output(ArrayType::new([m, n], I4), rows_block(rows, n))
        .build()
}
#[tpu_kernel]
fn int4_dot_kernel(x: Ref<i4>, w: Ref<i4>, o: RefMut<i32>) {
    o.store(dot(x.load(), w.load()));
}

/// `x @ w` of two int4 arrays, accumulated in i32 (one block; refused on v4).
#[export]
pub fn int4_dot(x: ArrayType, w: ArrayType) -> Result<PallasCall, KernelError> {
    let ([m, k], [_, n]) = (x.dims()?, w.dims()?);
    pallas_call(int4_dot_kernel)
        .grid([1])
        .input(x, BlockSpec::new([m, k], |[_i]| (0, 0)))
        .input(w, BlockSpec::new([k, n], |[_i]| (0, 0)))
        .output(
            ArrayType::new([m, n], I32),
            BlockSpec::new([m, n], |[_i]| (0, 0)),
        )
        .build()
}

#[tpu_kernel]
fn int4_weight_matmul_kernel(x: Ref<bf16>, w: Ref<i4>, scale: Ref<f32>, o: RefMut<f32>) {
    let acc = dot(x.load(), w.load().cast::<bf16>());
    o.store(acc * scale.load());
}

/// `(x @ w) * scale`: bf16 activations `[m, k]`, int4 weights `[k, n]` widened to bf16 in the kernel
/// (compiles on every generation, v4 included), an f32 scale per output column; 128-row blocks.
#[export]
pub fn int4_weight_matmul(
    x: ArrayType,
    w: ArrayType,
    scale: ArrayType,
) -> Result<PallasCall, KernelError> {
    let [m, k] = x.dims()?;
    let [_, n] = w.dims()?;
    let bm = m.min(128);
    pallas_call(int4_weight_matmul_kernel)
        .grid([x.blocks(0, bm)?])
        .input(x, BlockSpec::new([bm, k], |[i]| (i, 0)))
        .input(w, BlockSpec::new([k, n], |[_i]| (0, 0)))
        .input(scale, BlockSpec::new([1, n], |[_i]| (0, 0)))
        .output(
            ArrayType::new([m, n], F32),
            BlockSpec::new([bm, n], |[i]| (i, 0)),
        )
        .build()
}

#[tpu_kernel]
fn int4_copy_kernel(x: Ref<i4>, o: RefMut<i4>) {
    o.store(x.load());
}

/// A rank-1 int4 array copied in `block`-element blocks (int4's rank-1 tile is 1024 elements, with
/// no whole-array exception: libtpu cannot mask packed 4-bit rows).
#[export]
pub fn int4_copy_1d(
    x: ArrayType,
    #[default(1024)] block: usize,
) -> Result<PallasCall, KernelError> {
    let [n] = x.dims()?;
    let spec = || BlockSpec::new([block], |[i]| (i,));
    pallas_call(int4_copy_kernel)
        .grid([n.div_ceil(block.max(1))])
        .input(x.clone(), spec())
        .output(x, spec())
        .build()
}

#[tpu_kernel]
fn int4_dma_rows_kernel(x_hbm: Ref<i4, Any>, o: RefMut<i4>, buf: RefMut<i4>, sem: DmaSem) {
    let start = multiple_of(program_id(0) * 16, 16);
    let c = async_copy(x_hbm.at((ds(start, 16), ..)), buf, sem);
    c.start();
    c.wait();
    o.store(buf.load());
}

/// An int4 `[m, n]` array in HBM copied 16 rows per grid step by DMA into VMEM, then stored.
#[export]
pub fn int4_dma_rows(x: ArrayType) -> Result<PallasCall, KernelError> {
    let [m, n] = x.dims()?;
    pallas_call(int4_dma_rows_kernel)
        .grid([x.blocks(0, 16)?])
        .input_any(x)
        .output(
            ArrayType::new([m, n], I4),
            BlockSpec::new([16, n], |[i]| (i, 0)),
        )
        .scratch(Vmem::new([16, n], I4))
        .scratch(DmaSem::one())
        .build()
}

#[tpu_kernel]
fn int4_unsigned_kernel(
    x: Ref<i4>,
    u: Ref<u8>,
    a: RefMut<u8>,
    b: RefMut<u32>,
    c: RefMut<i4>,
    k: RefMut<i4>,
) {
    a.store(x.load().cast::<u8>());
    b.store(x.load().cast::<u32>());
    c.store(u.load().cast::<i4>());
    k.store(full([8, 128], i4::wrapping(-3)));
}

/// int4 `x` widened to u8 and u32 (sign-extended), u8 `u` narrowed to int4 (wrapping), and an int4
/// constant -3; `[m, 128]` arrays in 8-row blocks.
#[export]
pub fn int4_unsigned(x: ArrayType, u: ArrayType) -> Result<PallasCall, KernelError> {
    let [m, n] = x.dims()?;
    let rows = || BlockSpec::new([8, n], |[i]| (i, 0));
    pallas_call(int4_unsigned_kernel)
        .grid([x.blocks(0, 8)?])
        .input(x, rows())
        .input(u, rows())
        .output(ArrayType::new([m, n], U8), rows())
        .output(ArrayType::new([m, n], U32), rows())
        .output(ArrayType::new([m, n], I4), rows())
        .output(ArrayType::new([m, n], I4), rows())
        .build()
}
