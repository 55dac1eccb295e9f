//! The launch side (Pallas's `pallas_call`): grid, BlockSpecs with index maps, outputs, scratch, compiler
//! parameters. `build()` traces the index maps and the kernel body, runs the checks and returns a
//! [`PallasCall`] ready to lower or run.

use crate::check;
use crate::dtype::DType;
use crate::error::{kerr, Result, SourceLoc};
use crate::ir::{
    self, BlockIr, CostEstimate, DimensionSemantics, Kernel, MemSpace, Operand, OperandRole, Type,
};
use crate::opt;
use crate::target::Target;
use crate::trace::{self, KernelParam, ParamKind, Ref, Scalar, Val};

/// A whole array's shape and element type (an input or an output of the kernel).
#[derive(Clone, Debug, PartialEq)]
pub struct ArrayType {
    pub shape: Vec<usize>,
    pub dtype: DType,
}

impl ArrayType {
    pub fn new(shape: impl AsRef<[usize]>, dtype: DType) -> Self {
        ArrayType {
            shape: shape.as_ref().to_vec(),
            dtype,
        }
    }

    /// The shape as `[usize; R]`; an error at the caller's line when the array's rank is not `R`
    /// (what an exported launch function checks before it indexes the shape).
    #[track_caller]
    pub fn dims<const R: usize>(&self) -> Result<[usize; R]> {
        let loc = SourceLoc::caller();
        <[usize; R]>::try_from(self.shape.as_slice()).map_err(|_| {
            kerr!(
                Shape,
                "expected a rank-{R} array, got a {:?} {} array (rank {})",
                self.shape,
                self.dtype,
                self.shape.len()
            )
            .at(loc)
        })
    }

    /// How many blocks of `block` elements tile dimension `dim` — an error at the caller's line when
    /// they do not tile it exactly (a grid that does not divide the array).
    #[track_caller]
    pub fn blocks(&self, dim: usize, block: usize) -> Result<usize> {
        let loc = SourceLoc::caller();
        let Some(&n) = self.shape.get(dim) else {
            return Err(kerr!(
                Shape,
                "a {:?} {} array has no dimension {dim}",
                self.shape,
                self.dtype
            )
            .at(loc));
        };
        if block == 0 || n % block != 0 || n == 0 {
            return Err(kerr!(
                Grid,
                "dimension {dim} of the {:?} {} array ({n}) is not a multiple of the block size {block}; pick a block size that divides it",
                self.shape,
                self.dtype
            )
            .at(loc));
        }
        Ok(n / block)
    }
}

/// A shape rule of a launch function: `Ok` when `ok`, else a `Shape` error with `message` at the
/// caller's line — e.g. `require(y.shape[0] == k, format!("y has {} rows, x has {k} columns", y.shape[0]))?`.
#[track_caller]
pub fn require(ok: bool, message: impl std::fmt::Display) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(kerr!(Shape, "{message}").at(SourceLoc::caller()))
    }
}

/// A VMEM scratch buffer (`pltpu.VMEM(shape, dtype)`), persisting across grid steps; as a type, the
/// vector memory space of a ref (`Ref<f32, Vmem>`, the default).
#[derive(Clone, Debug, PartialEq)]
pub struct Vmem {
    pub shape: Vec<usize>,
    pub dtype: DType,
}

impl Vmem {
    pub fn new(shape: impl AsRef<[usize]>, dtype: DType) -> Self {
        Vmem {
            shape: shape.as_ref().to_vec(),
            dtype,
        }
    }
}

/// An SMEM scratch buffer (`pltpu.SMEM(shape, dtype)`) of 32-bit scalars; as a type, the scalar memory
/// space of a ref (`RefMut<i32, Smem>`).
#[derive(Clone, Debug, PartialEq)]
pub struct Smem {
    pub shape: Vec<usize>,
    pub dtype: DType,
}

impl Smem {
    pub fn new(shape: impl AsRef<[usize]>, dtype: DType) -> Self {
        Smem {
            shape: shape.as_ref().to_vec(),
            dtype,
        }
    }
}

/// The memory space of a whole array left where XLA placed it, usually HBM (`pl.ANY`): a
/// `Ref<T, Any>` cannot be loaded or stored, only windowed and copied by DMA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Any;

impl crate::trace::MemorySpace for Vmem {
    const SPACE: MemSpace = MemSpace::Vmem;
}
impl crate::trace::MemorySpace for Smem {
    const SPACE: MemSpace = MemSpace::Smem;
}
impl crate::trace::MemorySpace for Any {
    const SPACE: MemSpace = MemSpace::Any;
}

/// A scratch buffer: [`Vmem`] or [`Smem`].
pub trait Scratch {
    #[doc(hidden)]
    fn decl(self) -> (ArrayType, MemSpace);
}
impl Scratch for Vmem {
    fn decl(self) -> (ArrayType, MemSpace) {
        (ArrayType::new(self.shape, self.dtype), MemSpace::Vmem)
    }
}
impl Scratch for Smem {
    fn decl(self) -> (ArrayType, MemSpace) {
        (ArrayType::new(self.shape, self.dtype), MemSpace::Smem)
    }
}

/// One block index returned by an index map: a traced `Scalar<i32>` or a constant.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a block index",
    note = "index maps return block indices: grid indices, arithmetic on them, or integer constants"
)]
pub trait IndexArg {
    #[doc(hidden)]
    fn index_val(self) -> IndexVal;
}
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub enum IndexVal {
    Traced(Val),
    Const(i64),
}
impl IndexArg for Scalar<i32> {
    fn index_val(self) -> IndexVal {
        IndexVal::Traced(self.val())
    }
}
impl IndexArg for i32 {
    fn index_val(self) -> IndexVal {
        IndexVal::Const(self as i64)
    }
}
impl IndexArg for usize {
    fn index_val(self) -> IndexVal {
        // (past i64::MAX it cannot be a block index anyway: `build()` reports it as out of i32's range)
        IndexVal::Const(i64::try_from(self).unwrap_or(i64::MAX))
    }
}

/// What an index map returns: an array or a tuple of block indices, one per array dimension.
#[diagnostic::on_unimplemented(
    message = "an index map must return block indices, got `{Self}`",
    note = "return an array `[i, k]` or a tuple `(i, 0)` with one block index per array dimension"
)]
pub trait IndexTuple {
    #[doc(hidden)]
    fn indices(self) -> Vec<IndexVal>;
}
impl<A: IndexArg, const N: usize> IndexTuple for [A; N] {
    fn indices(self) -> Vec<IndexVal> {
        self.into_iter().map(IndexArg::index_val).collect()
    }
}
macro_rules! index_tuple {
    ($($n:ident),*) => {
        impl<$($n: IndexArg),*> IndexTuple for ($($n,)*) {
            #[allow(non_snake_case)]
            fn indices(self) -> Vec<IndexVal> {
                let ($($n,)*) = self;
                vec![$($n.index_val()),*]
            }
        }
    };
}
index_tuple!(A);
index_tuple!(A, B);
index_tuple!(A, B, C);
index_tuple!(A, B, C, D);
index_tuple!(A, B, C, D, E);

type IndexMapFn<'a> = Box<dyn Fn(&[Scalar<i32>], &[Val]) -> Vec<IndexVal> + 'a>;

/// Which block of an array each grid step sees: a block shape and an index map from grid indices to
/// block indices (`pl.BlockSpec(block_shape, index_map)`).
pub struct BlockSpec<'a> {
    pub(crate) shape: Vec<usize>,
    pub(crate) squeezed: Vec<bool>,
    /// A `.squeeze(d)` past the block's rank (reported by `build()`).
    pub(crate) bad_squeeze: Option<usize>,
    pub(crate) grid_rank: usize,
    /// How many scalar-prefetch refs the index map takes (`None`: it takes none).
    pub(crate) prefetch: Option<usize>,
    pub(crate) index_map: IndexMapFn<'a>,
    pub(crate) loc: SourceLoc,
}

impl<'a> BlockSpec<'a> {
    /// `BlockSpec::new([bm, bk], |[i, _, k]| [i, k])`: the closure takes one `Scalar<i32>` per grid axis.
    #[track_caller]
    pub fn new<const G: usize, const R: usize, F, O>(shape: [usize; R], index_map: F) -> Self
    where
        F: Fn([Scalar<i32>; G]) -> O + 'a,
        O: IndexTuple,
    {
        let f = move |grid: &[Scalar<i32>], _: &[Val]| -> Vec<IndexVal> {
            match <[Scalar<i32>; G]>::try_from(grid) {
                Ok(arr) => index_map(arr).indices(),
                Err(_) => Vec::new(),
            }
        };
        BlockSpec {
            shape: shape.to_vec(),
            squeezed: vec![false; R],
            bad_squeeze: None,
            grid_rank: G,
            prefetch: None,
            index_map: Box::new(f),
            loc: SourceLoc::caller(),
        }
    }

    /// A BlockSpec whose index map also reads the scalar-prefetch operands (Pallas's
    /// `PrefetchScalarGridSpec` index maps `lambda i, idx_ref: (idx_ref[i], 0)`):
    /// `BlockSpec::with_prefetch([8, n], |[i], [idx]| (idx.at(i).load(), 0))`. The closure takes one
    /// `Scalar<i32>` per grid axis and one SMEM ref per `.scalar_prefetch(..)` operand.
    #[track_caller]
    pub fn with_prefetch<const G: usize, const P: usize, const R: usize, F, O>(
        shape: [usize; R],
        index_map: F,
    ) -> Self
    where
        F: Fn([Scalar<i32>; G], [Ref<i32, Smem>; P]) -> O + 'a,
        O: IndexTuple,
    {
        let f = move |grid: &[Scalar<i32>], pre: &[Val]| -> Vec<IndexVal> {
            let refs = pre.iter().map(|v| Ref::<i32, Smem>::from_val(*v));
            match (
                <[Scalar<i32>; G]>::try_from(grid),
                <[Ref<i32, Smem>; P]>::try_from(refs.collect::<Vec<_>>()),
            ) {
                (Ok(g), Ok(p)) => index_map(g, p).indices(),
                _ => Vec::new(),
            }
        };
        BlockSpec {
            shape: shape.to_vec(),
            squeezed: vec![false; R],
            bad_squeeze: None,
            grid_rank: G,
            prefetch: Some(P),
            index_map: Box::new(f),
            loc: SourceLoc::caller(),
        }
    }

    /// Squeeze dimension `dim` (its block size must be 1): the kernel sees the block without it
    /// (`None` / `pl.Squeezed()` in a Pallas block shape).
    pub fn squeeze(mut self, dim: usize) -> Self {
        if dim < self.squeezed.len() {
            self.squeezed[dim] = true;
        } else {
            self.bad_squeeze.get_or_insert(dim);
        }
        self
    }
}

struct OperandDecl<'a> {
    role: OperandRole,
    array: ArrayType,
    block: Option<BlockSpec<'a>>,
    space: MemSpace,
    /// A scalar-prefetch operand (an input; placed first).
    prefetch: bool,
    loc: SourceLoc,
}

/// A kernel function usable with [`pallas_call`]: any `Fn` whose parameters are all [`KernelParam`]s.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a kernel function",
    label = "expected a #[tpu_kernel] fn (or a closure) whose parameters are Ref<T>/RefMut<T>",
    note = "kernel parameters are `Ref<T>` (inputs) then `RefMut<T>` (outputs, then scratch); compile-time parameters come last and are bound with `.bind(..)`: `pallas_call(my_kernel.bind(eps))` for `fn my_kernel(x: Ref<f32>, o: RefMut<f32>, eps: f32)`"
)]
pub trait KernelFn<Args> {
    #[doc(hidden)]
    fn params(&self) -> Vec<(ParamKind, DType, MemSpace)>;
    #[doc(hidden)]
    fn call(&self, args: &[Val]);
    /// The kernel's name when the builder is given none (`None`: the Rust name of the fn itself).
    #[doc(hidden)]
    fn kernel_name(&self) -> Option<String> {
        None
    }
}

macro_rules! kernel_fn {
    ($($n:ident),*) => {
        impl<Func, $($n: KernelParam),*> KernelFn<($($n,)*)> for Func
        where
            Func: Fn($($n),*),
        {
            fn params(&self) -> Vec<(ParamKind, DType, MemSpace)> {
                vec![$(($n::KIND, $n::DTYPE, $n::SPACE)),*]
            }
            #[allow(non_snake_case, unused_variables, unused_mut)]
            fn call(&self, args: &[Val]) {
                let mut it = args.iter().copied();
                $(let $n = $n::from_val(it.next().unwrap_or(Val::POISON));)*
                self($($n),*)
            }
        }
    };
}
kernel_fn!(A);
kernel_fn!(A, B);
kernel_fn!(A, B, C);
kernel_fn!(A, B, C, D);
kernel_fn!(A, B, C, D, E);
kernel_fn!(A, B, C, D, E, F);
kernel_fn!(A, B, C, D, E, F, G);
kernel_fn!(A, B, C, D, E, F, G, H);
kernel_fn!(A, B, C, D, E, F, G, H, I);
kernel_fn!(A, B, C, D, E, F, G, H, I, J);
kernel_fn!(A, B, C, D, E, F, G, H, I, J, K);
kernel_fn!(A, B, C, D, E, F, G, H, I, J, K, L);
kernel_fn!(A, B, C, D, E, F, G, H, I, J, K, L, M);
kernel_fn!(A, B, C, D, E, F, G, H, I, J, K, L, M, N);
kernel_fn!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O);
kernel_fn!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, Q);
kernel_fn!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, Q, R);
kernel_fn!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, Q, R, S);
kernel_fn!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, Q, R, S, T);
kernel_fn!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, Q, R, S, T, U);
kernel_fn!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, Q, R, S, T, U, V);
kernel_fn!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, Q, R, S, T, U, V, W);
kernel_fn!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, Q, R, S, T, U, V, W, X);
kernel_fn!(A, B, C, D, E, F, G, H, I, J, K, L, M, N, O, Q, R, S, T, U, V, W, X, Y);

/// Start describing a kernel launch (`pl.pallas_call`).
#[track_caller]
pub fn pallas_call<'a, Args, K: KernelFn<Args> + 'a>(kernel: K) -> PallasCallBuilder<'a, K, Args> {
    PallasCallBuilder {
        name: kernel.kernel_name().unwrap_or_else(default_name::<K>),
        kernel,
        grid: Vec::new(),
        grid_loc: None,
        operands: Vec::new(),
        semantics: None,
        vmem_limit_bytes: None,
        cost_estimate: None,
        aliases: None,
        target: None,
        checks_off: (false, false),
        any_in_hbm: false,
        mesh: None,
        collective_id: None,
        loc: SourceLoc::caller(),
        _args: std::marker::PhantomData,
    }
}

/// The Rust name of the kernel fn (`matmul_kernel`); closures fall back to "kernel" (use `.name(..)`).
pub(crate) fn default_name<K>() -> String {
    let full = std::any::type_name::<K>();
    if full.contains("{{closure}}") {
        return "kernel".to_string();
    }
    let base = full.split('<').next().unwrap_or(full);
    base.rsplit("::").next().unwrap_or(base).to_string()
}

/// Builder returned by [`pallas_call`].
pub struct PallasCallBuilder<'a, K, Args> {
    kernel: K,
    name: String,
    grid: Vec<usize>,
    grid_loc: Option<SourceLoc>,
    operands: Vec<OperandDecl<'a>>,
    semantics: Option<(Vec<DimensionSemantics>, SourceLoc)>,
    vmem_limit_bytes: Option<u64>,
    cost_estimate: Option<CostEstimate>,
    aliases: Option<(Vec<(usize, usize)>, SourceLoc)>,
    target: Option<Target>,
    checks_off: (bool, bool),
    any_in_hbm: bool,
    mesh: Option<crate::mesh::Mesh>,
    collective_id: Option<u32>,
    loc: SourceLoc,
    _args: std::marker::PhantomData<fn(Args)>,
}

impl<'a, K: KernelFn<Args>, Args> PallasCallBuilder<'a, K, Args> {
    /// Kernel name (the MLIR module/func name and the custom call's `kernel_name`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }
    /// The grid: how many steps along each axis (last axis iterates fastest).
    #[track_caller]
    pub fn grid(mut self, grid: impl AsRef<[usize]>) -> Self {
        self.grid = grid.as_ref().to_vec();
        self.grid_loc = Some(SourceLoc::caller());
        self
    }
    fn push(
        mut self,
        role: OperandRole,
        array: ArrayType,
        block: Option<BlockSpec<'a>>,
        space: MemSpace,
        loc: SourceLoc,
    ) -> Self {
        self.operands.push(OperandDecl {
            role,
            array,
            block,
            space,
            prefetch: false,
            loc,
        });
        self
    }
    /// A scalar-prefetch operand (Pallas's `PrefetchScalarGridSpec(num_scalar_prefetch=..)`): a whole
    /// i32 array placed in SMEM before the grid runs. The kernel receives it as a `Ref<i32, Smem>`
    /// parameter right after the grid indices, and index maps made with [`BlockSpec::with_prefetch`]
    /// receive it too. Scalar-prefetch operands come first among the call's inputs.
    #[track_caller]
    pub fn scalar_prefetch(mut self, array: ArrayType) -> Self {
        let loc = SourceLoc::caller();
        self.operands.push(OperandDecl {
            role: OperandRole::Input,
            array,
            block: None,
            space: MemSpace::Smem,
            prefetch: true,
            loc,
        });
        self
    }
    /// An input array, windowed by `block` into VMEM.
    #[track_caller]
    pub fn input(self, array: ArrayType, block: BlockSpec<'a>) -> Self {
        let loc = SourceLoc::caller();
        self.push(OperandRole::Input, array, Some(block), MemSpace::Vmem, loc)
    }
    /// An input array passed whole and left where XLA put it, usually HBM (`memory_space=pl.ANY`):
    /// the kernel receives a `Ref<T, Any>`, which it can only window and copy by DMA.
    #[track_caller]
    pub fn input_any(self, array: ArrayType) -> Self {
        let loc = SourceLoc::caller();
        self.push(OperandRole::Input, array, None, MemSpace::Any, loc)
    }
    /// An output array (`out_shape`), windowed by `block` (`out_specs`).
    #[track_caller]
    pub fn output(self, array: ArrayType, block: BlockSpec<'a>) -> Self {
        let loc = SourceLoc::caller();
        self.push(OperandRole::Output, array, Some(block), MemSpace::Vmem, loc)
    }
    /// An output array left in HBM (`out_specs=pl.BlockSpec(memory_space=pl.ANY)`): the kernel
    /// receives a `RefMut<T, Any>` and writes it by DMA (e.g. [`crate::trace::Pipeline`]). Parts it never
    /// writes are undefined on TPU (zeros, or the poison pattern, in interpret mode; the input's
    /// contents when aliased).
    #[track_caller]
    pub fn output_any(self, array: ArrayType) -> Self {
        let loc = SourceLoc::caller();
        self.push(OperandRole::Output, array, None, MemSpace::Any, loc)
    }
    /// A scratch buffer (`scratch_shapes`): `Vmem::new(shape, dtype)` or `Smem::new(shape, dtype)`.
    #[track_caller]
    pub fn scratch(self, buf: impl Scratch) -> Self {
        let loc = SourceLoc::caller();
        let (array, space) = buf.decl();
        self.push(OperandRole::Scratch, array, None, space, loc)
    }
    /// Per grid axis: `Parallel` (steps independent) or `Arbitrary` (sequential, e.g. a reduction).
    #[track_caller]
    pub fn dimension_semantics(mut self, s: impl AsRef<[DimensionSemantics]>) -> Self {
        self.semantics = Some((s.as_ref().to_vec(), SourceLoc::caller()));
        self
    }
    /// The TPU generation to build for: the VMEM check uses its limits, the backend_config carries
    /// its scoped VMEM limit, lowering rules that differ per generation follow it. Without it the
    /// launch builds for the target in scope ([`Target::scope`]: an exported kernel's request, the
    /// example command line's `--target`), else for [`Target::DEFAULT`] (v5e). A launch function
    /// reading its target (`#[export] fn f(x: ArrayType, target: Target)`) can pick block sizes from
    /// `target.info()` (VMEM, MXU size).
    pub fn target(mut self, target: Target) -> Self {
        self.target = Some(target);
        self
    }
    /// The scoped VMEM limit for this kernel (`vmem_limit_bytes`); without it, the target's default
    /// (`Target::info().default_scoped_vmem_bytes`: libtpu's own, 16 MiB on v5e, 32 MiB on v6e).
    pub fn vmem_limit_bytes(mut self, bytes: u64) -> Self {
        self.vmem_limit_bytes = Some(bytes);
        self
    }
    /// [`vmem_limit_bytes`](Self::vmem_limit_bytes) from a launch function's argument of that name,
    /// as tpu-inference's kernels take it (`#[default(None)] vmem_limit_bytes: Option<i64>`): `None`
    /// keeps the target's default; a value that is not positive is the caller's error, naming the
    /// argument.
    pub fn vmem_limit_argument(self, vmem_limit_bytes: Option<i64>) -> Result<Self> {
        match vmem_limit_bytes {
            None => Ok(self),
            Some(v) if v > 0 => Ok(self.vmem_limit_bytes(v as u64)),
            Some(v) => Err(crate::error::KernelError::new(
                crate::error::ErrorKind::Signature,
                format!("{v} must be positive"),
            )
            .for_argument("vmem_limit_bytes")),
        }
    }
    /// Outputs that reuse an input's buffer (`input_output_aliases={input: output}`), as `(input,
    /// output)` indices among the call's inputs (scalar-prefetch operands first) and outputs: the
    /// output starts as that input's contents, blocks the kernel does not write keep them, and XLA
    /// can update the array in place (with a donated input, no copy).
    #[track_caller]
    pub fn input_output_aliases(mut self, pairs: impl AsRef<[(usize, usize)]>) -> Self {
        self.aliases = Some((pairs.as_ref().to_vec(), SourceLoc::caller()));
        self
    }
    /// Turn off libtpu's run-time bounds checks of this kernel's copies and ref accesses (Pallas's
    /// `disable_bounds_checks=True`; tpu-inference's paged attention does: a check per small page
    /// copy costs more than the copy). The CPU engines still check every access.
    pub fn disable_bounds_checks(mut self) -> Self {
        self.checks_off.0 = true;
        self
    }
    /// Turn off libtpu's run-time semaphore checks (Pallas's `disable_semaphore_checks=True`: a
    /// semaphore left counting at the kernel's end is not reported on the TPU). The CPU engines still
    /// report races, deadlocks and semaphores left counting.
    pub fn disable_semaphore_checks(mut self) -> Self {
        self.checks_off.1 = true;
        self
    }
    /// Pin the whole-array operands (`input_any`, `output_any`) to HBM: their refs are
    /// `#tpu.memory_space<hbm>` (Pallas's `BlockSpec(memory_space=pltpu.HBM)`) instead of `any`, which
    /// lets XLA place a small array in VMEM — where libtpu turns its copies into vector loops.
    pub fn any_in_hbm(mut self) -> Self {
        self.any_in_hbm = true;
        self
    }
    /// The device mesh the kernel runs over, one instance per device (the mesh of the `jax.shard_map`
    /// it is called in): `axis_index`, `axis_size` and remote device ids in the body follow it.
    /// Without it, the mesh in scope ([`crate::mesh::Mesh::scope`]: an exported kernel's request).
    pub fn mesh(mut self, mesh: crate::mesh::Mesh) -> Self {
        self.mesh = Some(mesh);
        self
    }
    /// The collective id of the kernel's barrier semaphore (Pallas's `CompilerParams(collective_id=
    /// ..)`): kernels with one id share a barrier semaphore per device ([`crate::trace::barrier_semaphore`]).
    pub fn collective_id(mut self, id: u32) -> Self {
        self.collective_id = Some(id);
        self
    }
    /// A cost estimate passed to XLA's scheduler.
    pub fn cost_estimate(mut self, c: CostEstimate) -> Self {
        self.cost_estimate = Some(c);
        self
    }

    /// Trace the index maps and the kernel body, check everything against the TPU rules.
    pub fn build(self) -> Result<PallasCall> {
        let loc = self.loc;
        match crate::error::catch_located(|| self.build_inner()) {
            Ok(r) => r,
            Err((payload, at)) => match trace::abort() {
                // A panic after a recorded mistake is usually its consequence (a poisoned value's empty
                // `shape()` indexed, ...): the mistake is the error to report, at its own line.
                Some(first) => Err(first),
                None => {
                    let msg = crate::error::panic_message(&*payload);
                    let at = at.unwrap_or_else(|| "an unknown place".into());
                    Err(if crate::error::is_library_location(&at) {
                        kerr!(
                            Internal,
                            "tpu-kernel panicked at {at} while building this kernel: {msg} (a bug in tpu-kernel, not in your kernel; please report it)"
                        )
                        .at(loc)
                    } else {
                        kerr!(
                            Trace,
                            "the kernel body panicked while tracing, at {at}: {msg}"
                        )
                    })
                }
            },
        }
    }

    fn build_inner(self) -> Result<PallasCall> {
        if self.name.trim().is_empty() {
            return Err(kerr!(
                Signature,
                "the kernel name {:?} is empty; `.name(..)` takes the Mosaic module's symbol, e.g. `.name(\"my_kernel\")`",
                self.name
            )
            .at(self.loc));
        }
        if let Some(v) = self.vmem_limit_bytes.filter(|&v| v > i64::MAX as u64) {
            return Err(kerr!(
                Vmem,
                "vmem_limit_bytes({v}) is above i64::MAX, which libtpu's backend config cannot hold; the chips have at most 128 MiB of VMEM"
            )
            .at(self.loc));
        }
        let grid = self.grid.clone();
        let grid_loc = self.grid_loc.unwrap_or(self.loc);
        let semantics = match &self.semantics {
            Some((s, loc)) => {
                if s.len() != grid.len() {
                    return Err(kerr!(
                        Grid,
                        "dimension_semantics has {} entries but the grid {grid:?} has {} axes",
                        s.len(),
                        grid.len()
                    )
                    .at(*loc));
                }
                s.clone()
            }
            None => vec![DimensionSemantics::Arbitrary; grid.len()],
        };
        check::grid(&grid).map_err(|e| e.at(grid_loc))?;

        // Operands in kernel-parameter order: inputs, outputs, scratch.
        let mut decls = self.operands;
        decls.sort_by_key(|d| match d.role {
            OperandRole::Input if d.prefetch => 0,
            OperandRole::Input => 1,
            OperandRole::Output => 2,
            OperandRole::Scratch => 3,
        });
        let prefetch: Vec<Type> = decls
            .iter()
            .filter(|d| d.prefetch)
            .map(|d| Type::Ref(d.array.shape.clone(), d.array.dtype, MemSpace::Smem))
            .collect();
        let mut operands = Vec::new();
        let mut counters = [0usize; 3];
        let mut transform_no = 0;
        for d in &decls {
            let index = &mut counters[d.role as usize];
            let label = format!("{} {}", d.role.name(), *index);
            let block = match &d.block {
                Some(spec) => {
                    let b = trace_block(spec, &grid, &prefetch, &d.array, transform_no)
                        .map_err(|e| e.for_argument(&label).at(spec.loc))?;
                    Some(b)
                }
                None => None,
            };
            // Pallas names index maps by operand position among the windowed inputs and outputs
            // (an ANY operand keeps its number), after the scalar-prefetch operands.
            if !d.prefetch && d.role != OperandRole::Scratch {
                transform_no += 1;
            }
            let space = d.space;
            operands.push(Operand {
                role: d.role,
                index: *index,
                shape: d.array.shape.clone(),
                dtype: d.array.dtype,
                space,
                block,
                loc: d.loc,
            });
            *index += 1;
        }
        let aliased_outputs: Vec<usize> = match &self.aliases {
            Some((pairs, _)) => pairs.iter().map(|p| p.1).collect(),
            None => Vec::new(),
        };
        for op in &operands {
            let aliased = op.role == OperandRole::Output && aliased_outputs.contains(&op.index);
            check::operand(op, &grid, aliased)
                .map_err(|e| e.for_argument(op.label()).at(op.loc))?;
        }

        // Kernel parameters must line up with the operands.
        let params = self.kernel.params();
        check::params(&params, &operands).map_err(|e| e.at(self.loc))?;

        let mut param_types: Vec<Type> = vec![Type::Scalar(DType::I32); grid.len()];
        param_types.extend(
            operands
                .iter()
                .map(|o| Type::Ref(o.ref_shape(), o.dtype, o.space)),
        );
        let (trace, vals) = trace::begin(&grid, &param_types, grid.len())?;
        let mesh = self.mesh.clone().or_else(crate::mesh::Mesh::current);
        trace::communication(mesh.clone(), self.collective_id);
        self.kernel.call(&vals[grid.len()..]);
        let body = trace::finish(trace, &self.name, vec![], self.loc)?;

        let aliases = match &self.aliases {
            Some((pairs, at)) => {
                check::aliases(pairs, &operands).map_err(|e| e.at(*at))?;
                pairs.clone()
            }
            None => Vec::new(),
        };
        let loc = self.loc;
        let mut kernel = Kernel {
            name: self.name,
            grid,
            dimension_semantics: semantics,
            operands,
            scalar_prefetch: prefetch.len(),
            aliases,
            body,
            vmem_limit_bytes: self.vmem_limit_bytes,
            cost_estimate: self.cost_estimate,
            target: self.target.unwrap_or_else(Target::current),
            disable_bounds_checks: self.checks_off.0,
            disable_semaphore_checks: self.checks_off.1,
            any_in_hbm: self.any_in_hbm,
            mesh,
            collective_id: self.collective_id,
        };
        crate::expand::run(&mut kernel);
        check::kernel(&kernel).map_err(|e| e.at(loc))?;
        opt::run(&mut kernel);
        Ok(PallasCall { kernel })
    }
}

fn trace_block(
    spec: &BlockSpec<'_>,
    grid: &[usize],
    prefetch: &[Type],
    array: &ArrayType,
    n: usize,
) -> Result<BlockIr> {
    if spec.grid_rank != grid.len() {
        return Err(kerr!(
            Grid,
            "the index map takes {} grid indices but the grid {grid:?} has {} axes",
            spec.grid_rank,
            grid.len()
        ));
    }
    if let Some(p) = spec.prefetch {
        if p != prefetch.len() {
            return Err(kerr!(
                Grid,
                "the index map takes {p} scalar-prefetch refs but the call has {} (`.scalar_prefetch(..)` operands)",
                prefetch.len()
            ));
        }
    }
    // Pallas passes every index map the scalar-prefetch refs after the grid indices.
    let mut params = vec![Type::Scalar(DType::I32); grid.len()];
    params.extend(prefetch.iter().cloned());
    let (trace, vals) = trace::begin(grid, &params, grid.len())?;
    let idx: Vec<Scalar<i32>> = vals[..grid.len()]
        .iter()
        .map(|v| Scalar::from_val(*v))
        .collect();
    let outs = (spec.index_map)(&idx, &vals[grid.len()..]);
    // Constants become values of the transform function.
    let mut results = Vec::new();
    for o in &outs {
        results.push(match o {
            IndexVal::Traced(v) => *v,
            IndexVal::Const(c) => {
                let Ok(c) = i32::try_from(*c) else {
                    return Err(kerr!(
                        OutOfBounds,
                        "the index map returns the block index {c}, which does not fit i32 (Mosaic's block indices are i32)"
                    ));
                };
                let lit = crate::dtype::Literal::from_i64(DType::I32, c as i64);
                trace::emit(spec.loc, |t| {
                    Ok(t.push1(
                        ir::OpKind::Const(lit),
                        vec![],
                        Type::Scalar(DType::I32),
                        spec.loc,
                    ))
                })
            }
        });
    }
    let func = trace::finish(trace, &format!("transform_{n}"), results, spec.loc)?;
    if outs.len() != array.shape.len() {
        return Err(kerr!(
            Grid,
            "the index map returns {} block indices but the array {:?} has rank {}",
            outs.len(),
            array.shape,
            array.shape.len()
        ));
    }
    if let Some(dim) = spec.bad_squeeze {
        return Err(kerr!(
            Grid,
            "`.squeeze({dim})` names a dimension the block shape {:?} (rank {}) does not have",
            spec.shape,
            spec.shape.len()
        ));
    }
    if spec.shape.len() != array.shape.len() {
        return Err(kerr!(
            Grid,
            "block shape {:?} has rank {} but the array {:?} has rank {}",
            spec.shape,
            spec.shape.len(),
            array.shape,
            array.shape.len()
        ));
    }
    Ok(BlockIr {
        block_shape: spec.shape.clone(),
        squeezed: spec.squeezed.clone(),
        index_map: func,
    })
}

/// A traced and checked kernel launch, ready to lower to Mosaic or to run on CPU.
#[derive(Clone, Debug)]
pub struct PallasCall {
    pub(crate) kernel: Kernel,
}

impl PallasCall {
    /// The checked kernel IR, mutable, for tools that build what the checks would reject (the
    /// toolchain-agreement probes): a change made here is not checked again, and what it lowers to
    /// may be rejected by libtpu. Not for kernels.
    #[doc(hidden)]
    pub fn unchecked_ir_mut(&mut self) -> &mut Kernel {
        &mut self.kernel
    }
    /// The Mosaic module as data: what lowering makes of the kernel, before any writer (no MLIR
    /// involved; available with default features).
    pub fn mosaic_module(&self) -> Result<crate::mosaic::MModule> {
        crate::lower::lower_module(&self.kernel)
    }
    /// The Mosaic MLIR module text (verified by MLIR). Needs the `mlir` feature (LLVM/MLIR 22 at
    /// build time); shipping a kernel does not.
    #[cfg(feature = "mlir")]
    pub fn mosaic_mlir(&self) -> Result<String> {
        self.mosaic_text(crate::mosaic::mlir::Form::Custom)
    }
    /// The Mosaic MLIR module text in MLIR's generic op form: what another MLIR version (jaxlib's, a
    /// `mlir-opt` of another release) parses whatever the ops' custom syntax — use it to hand the module
    /// to other tools. [`mosaic_mlir`](Self::mosaic_mlir) is the readable form, in LLVM 22's syntax.
    #[cfg(feature = "mlir")]
    pub fn mosaic_mlir_generic(&self) -> Result<String> {
        self.mosaic_text(crate::mosaic::mlir::Form::Generic)
    }
    /// The Mosaic MLIR module text with each op's Rust `file:line:col` location printed.
    #[cfg(feature = "mlir")]
    pub fn mosaic_mlir_with_locations(&self) -> Result<String> {
        self.mosaic_text(crate::mosaic::mlir::Form::WithLocations)
    }
    #[cfg(feature = "mlir")]
    fn mosaic_text(&self, form: crate::mosaic::mlir::Form) -> Result<String> {
        crate::mosaic::mlir::text(&self.mosaic_module()?, form)
    }
    /// The kernel IR.
    pub fn ir(&self) -> &Kernel {
        &self.kernel
    }
    pub fn name(&self) -> &str {
        &self.kernel.name
    }
    /// The TPU generation the kernel is built for (`.target(..)`, else the target in scope).
    pub fn target(&self) -> Target {
        self.kernel.target
    }
    /// Estimated VMEM use in bytes (blocks double-buffered, plus scratch).
    pub fn vmem_estimate(&self) -> u64 {
        check::vmem_estimate(&self.kernel)
    }
    /// A short human summary.
    pub fn summary(&self) -> String {
        let k = &self.kernel;
        let mut s = format!(
            "kernel `{}`: grid {:?} ({:?})\n",
            k.name, k.grid, k.dimension_semantics
        );
        for o in &k.operands {
            s += &format!(
                "  {:<10} {:>12} {:<5}",
                o.label(),
                format!("{:?}", o.shape),
                o.dtype.name()
            );
            if let Some(b) = &o.block {
                s += &format!(" block {:?}", b.block_shape);
            }
            s += "\n";
        }
        let mut n_ops = 0;
        k.body.walk(&mut |_| n_ops += 1);
        s += &format!(
            "  body: {n_ops} IR ops; VMEM estimate {:.1} KiB (limit {:.1} KiB on {})",
            self.vmem_estimate() as f64 / 1024.0,
            check::vmem_limit(k) as f64 / 1024.0,
            k.target
        );
        s
    }
}

impl PallasCall {
    /// Run the kernel on the CPU with Pallas TPU semantics (see [`crate::interpret`]): one host array per
    /// input, in order; returns one per output.
    /// Run the kernel on every device of `mesh` (the mesh it was built for: `.mesh(..)` or
    /// `Mesh::scope`), device `d` on `inputs[d]`, with its remote copies and signals between them
    /// ([`crate::interpret::interpret_spmd`]); returns each device's outputs. Races and deadlocks
    /// across devices are errors at the user's line naming the devices.
    pub fn interpret_spmd(
        &self,
        mesh: &crate::mesh::Mesh,
        inputs: &[Vec<crate::interpret::HostArray>],
    ) -> Result<Vec<Vec<crate::interpret::HostArray>>> {
        crate::interpret::interpret_spmd(
            &self.kernel,
            mesh,
            inputs,
            &crate::interpret::InterpretOptions::default(),
        )
    }

    pub fn interpret(
        &self,
        inputs: &[crate::interpret::HostArray],
    ) -> Result<Vec<crate::interpret::HostArray>> {
        crate::interpret::interpret(
            &self.kernel,
            inputs,
            &crate::interpret::InterpretOptions::default(),
        )
    }
    /// [`PallasCall::interpret`] with options (poisoning of uninitialized memory, parallelism).
    pub fn interpret_with(
        &self,
        inputs: &[crate::interpret::HostArray],
        options: &crate::interpret::InterpretOptions,
    ) -> Result<Vec<crate::interpret::HostArray>> {
        crate::interpret::interpret(&self.kernel, inputs, options)
    }
}
