//! The kernel IR: one typed, printable representation of a traced kernel, read by the checks, the Mosaic
//! lowering and the CPU interpreter alike.
//!
//! A [`Func`] owns a value table (every SSA value's [`Type`]) and a body [`Region`] of [`Op`]s; ops may own
//! nested regions (`if`, `for`, `while`). A [`Kernel`] is the kernel body plus the launch configuration
//! (grid, operands with their BlockSpecs, whose index maps are `Func`s too).

mod ops;
mod print;
pub use print::op_label;

pub use ops::{
    for_each_binary, for_each_composite, for_each_unary, Accepts, BinaryOp, CompositeOp,
    ElementClass, Operands, UnaryOp,
};

use crate::dtype::{DType, Literal};
use crate::error::SourceLoc;

/// An SSA value, an index into its function's value table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

/// Where a ref lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemSpace {
    Vmem,
    Smem,
    Any,
    /// Semaphores (`#tpu.memory_space<semaphore_mem>`): a ref of them, of either kind.
    Sem(SemKind),
}

/// What a semaphore counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SemKind {
    /// Signalled by DMA completion (`!tpu.dma_semaphore`, `pltpu.SemaphoreType.DMA`).
    Dma,
    /// Signalled by the kernel (`!tpu.semaphore`, `pltpu.SemaphoreType.REGULAR`).
    Regular,
}

impl MemSpace {
    pub fn mosaic(self) -> &'static str {
        match self {
            MemSpace::Vmem => "vmem",
            MemSpace::Smem => "smem",
            MemSpace::Any => "any",
            MemSpace::Sem(_) => "semaphore_mem",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Type {
    /// A scalar (`i32` grid index, loop counter, condition, ...).
    Scalar(DType),
    /// A vector value of a static shape.
    Vector(Vec<usize>, DType),
    /// A memory ref (kernel operand or scratch).
    Ref(Vec<usize>, DType, MemSpace),
}

impl Type {
    pub fn dtype(&self) -> DType {
        match self {
            Type::Scalar(d) | Type::Vector(_, d) | Type::Ref(_, d, _) => *d,
        }
    }
    /// The shape; scalars have shape `[]`.
    pub fn shape(&self) -> &[usize] {
        match self {
            Type::Scalar(_) => &[],
            Type::Vector(s, _) | Type::Ref(s, _, _) => s,
        }
    }
    pub fn with_dtype(&self, d: DType) -> Type {
        match self {
            Type::Scalar(_) => Type::Scalar(d),
            Type::Vector(s, _) => Type::Vector(s.clone(), d),
            Type::Ref(s, _, m) => Type::Ref(s.clone(), d, *m),
        }
    }
    pub fn is_ref(&self) -> bool {
        matches!(self, Type::Ref(..))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceKind {
    Sum,
    Max,
    Min,
}

/// A dimension known only when the kernel runs: a ref window of a traced size (`ds(s, n)` with `n` a
/// `Scalar<i32>`), in a `Type::Ref` shape (MLIR's `?`).
pub const DYNAMIC: usize = usize::MAX;

/// Where a load/store window starts along one dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    Static(usize),
    /// The next dynamic index operand (an `i32` scalar).
    Dynamic,
}

/// The window of a ref that a load or store touches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    pub starts: Vec<Start>,
    pub sizes: Vec<usize>,
    /// Dimensions indexed by a single integer: present in the ref, dropped from the value.
    pub squeezed: Vec<bool>,
    /// Steps between the window's elements along each dimension (`ds(s, n).stride(k)`); 1 for a
    /// dense window. Element `i` of dimension `d` is the ref's `starts[d] + i * strides[d]`.
    pub strides: Vec<usize>,
    /// Dimensions whose size is known only at run time: the next dynamic size operand (an `i32`
    /// scalar, after the dynamic starts); `sizes[d]` is then the base's dimension, an upper bound.
    /// Only `RefView` windows (DMA endpoints) have them.
    pub dynamic_sizes: Vec<bool>,
}

impl Window {
    pub fn full(shape: &[usize]) -> Self {
        Window {
            starts: vec![Start::Static(0); shape.len()],
            sizes: shape.to_vec(),
            squeezed: vec![false; shape.len()],
            strides: vec![1; shape.len()],
            dynamic_sizes: vec![false; shape.len()],
        }
    }
    /// Whether some dimension's size is known only at run time.
    pub fn has_dynamic_size(&self) -> bool {
        self.dynamic_sizes.contains(&true)
    }
    /// Whether some dimension steps by more than one element (`tpu.strided_load`/`strided_store`).
    pub fn is_strided(&self) -> bool {
        self.strides.iter().any(|s| *s != 1)
    }
    /// How far the window reaches along dimension `d`: `(sizes[d] - 1) * strides[d] + 1`.
    pub fn extent(&self, d: usize) -> usize {
        self.sizes[d].saturating_sub(1) * self.strides[d] + 1
    }
    /// Shape of the value loaded or stored (squeezed dims removed).
    pub fn value_shape(&self) -> Vec<usize> {
        self.sizes
            .iter()
            .zip(&self.squeezed)
            .zip(&self.dynamic_sizes)
            .filter(|((_, s), _)| !**s)
            .map(|((n, _), dynamic)| if *dynamic { DYNAMIC } else { *n })
            .collect()
    }
    pub fn n_dynamic(&self) -> usize {
        self.starts
            .iter()
            .filter(|s| matches!(s, Start::Dynamic))
            .count()
    }
    pub fn is_full(&self, shape: &[usize]) -> bool {
        self.starts.iter().all(|s| *s == Start::Static(0))
            && self.sizes == shape
            && !self.squeezed.iter().any(|s| *s)
            && !self.is_strided()
            && !self.has_dynamic_size()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum OpKind {
    /// A scalar constant, or a vector splat of one value.
    Const(Literal),
    Unary(UnaryOp),
    /// A composition of table ops (`expm1`, `sign`), as traced; `build()` expands it for the launch's
    /// target (`crate::expand`), so neither engine meets one.
    Composite(CompositeOp),
    Binary(BinaryOp),
    Compare(CmpOp),
    /// `select(cond, on_true, on_false)`: `cond` a bool value of the result's shape, or a bool scalar
    /// choosing a whole operand (`arith.select %i1, %a, %b`, as Pallas lowers `jnp.where` with a scalar
    /// predicate).
    Select,
    Cast(DType),
    /// Broadcast a scalar or a vector (numpy rules) to the result shape.
    Broadcast,
    Iota {
        dim: usize,
    },
    Reshape,
    Transpose {
        perm: Vec<usize>,
    },
    Reduce {
        kind: ReduceKind,
        axes: Vec<usize>,
        keepdims: bool,
    },
    /// `lhs @ rhs` (+ `acc` when a third operand is present), accumulating in the result dtype.
    Dot {
        transpose_lhs: bool,
        transpose_rhs: bool,
    },
    /// Operands: ref, dynamic starts...
    Load(Window),
    /// Operands: ref, value, dynamic starts..., `[mask]`.
    Store {
        window: Window,
        masked: bool,
    },
    /// A window of a ref, as a ref (for DMA and semaphore selection). Operands: ref, dynamic
    /// starts..., dynamic sizes... Result: a ref of the window's shape (squeezed dims dropped,
    /// run-time sizes [`DYNAMIC`]), same space.
    RefView(Window),
    /// A ref seen as another element type (`r.bitcast::<U>()`, Pallas's `ref.bitcast`): the result's
    /// second-to-last dimension is the operand's scaled by the ratio of the bit widths, consecutive
    /// rows packed into (or unpacked from) one element, the lowest bits first (`pltpu.bitcast`'s rule);
    /// other dimensions unchanged. Operands: the ref. Result: the view (same space).
    RefBitcast,
    /// A ref seen with another shape of the same elements in row-major order (`r.reshape([..])`,
    /// Pallas's `ref.reshape`). Operands: the ref. Result: the view (same space and element type).
    RefReshape,
    /// Start a DMA. Operands: source ref, destination ref, DMA semaphore.
    DmaStart,
    /// Wait for a DMA of this shape to complete. Operands: source ref, destination ref, DMA semaphore.
    DmaWait,
    /// Add `amount` to a semaphore. Operands: semaphore, amount (i32).
    SemSignal,
    /// Wait until a semaphore holds `amount`, then subtract it. Operands: semaphore, amount (i32).
    SemWait,
    /// A semaphore's value. Operands: semaphore. Result: i32.
    SemRead,
    /// This device's index along one mesh axis (`jax.lax.axis_index`): `(device_id / stride) % size`,
    /// where the device id (`tpu.device_id`) numbers the mesh row-major and `stride`, `size` are the
    /// axis's. Unsigned arithmetic, as Pallas lowers it (libtpu then knows the index is in
    /// `0..size`). Result: i32.
    AxisIndex {
        stride: u32,
        size: u32,
    },
    /// Start a copy from a local ref into the same-shaped ref of another device
    /// (`pltpu.make_async_remote_copy(..).start()`). Operands: source, destination, send semaphore
    /// (signalled as the data leaves), receive semaphore (the destination device's, signalled as it
    /// lands), device id (i32, logical).
    RemoteDmaStart,
    /// Wait for a remote copy's send (`recv: false`: the source may be written again) or its receive
    /// on this device (`recv: true`: a copy into this device's destination has landed). Operands as
    /// [`OpKind::RemoteDmaStart`].
    RemoteDmaWait {
        recv: bool,
    },
    /// Add `amount` to a semaphore of another device (`pl.semaphore_signal(sem, n, device_id=..)`).
    /// Operands: semaphore, amount (i32), device id (i32, logical).
    SemSignalRemote,
    /// The barrier semaphore of the launch's collective (`pltpu.get_barrier_semaphore()`: one regular
    /// semaphore per device, shared by every kernel with the same collective id). Result: the semaphore.
    BarrierSemaphore,
    /// Scratch allocated for a scope (`pl.run_scoped`). Region: the body; its arguments are the
    /// allocated refs (VMEM, SMEM or semaphores), freed when it ends.
    Scoped,
    /// Start of a named trace region (`jax.named_scope` in a Pallas kernel): an XProf region on TPU.
    TraceStart(String),
    /// End of the innermost trace region.
    TraceStop,
    /// Hint that an i32 scalar is a multiple of the given value.
    MultipleOf(u32),
    /// Operands: condition. Regions: then, else. Results: the yielded values.
    If,
    /// Operands: lower, upper, step, inits... Region: body (args: induction var, carried...).
    For,
    /// Operands: inits... Regions: before (args: carried; ends with Condition), after (args: carried).
    While,
    /// Terminator of `if`/`for` bodies and the `while` after-region.
    Yield,
    /// Terminator of the `while` before-region: operands cond, carried...
    Condition,
    /// Terminator of a function.
    Return,
    /// A static window of a vector value (`x[a:b, c:d]`, stride 1): the result has shape `sizes` and
    /// element `i` is the operand's element `offsets + i`.
    Slice {
        offsets: Vec<usize>,
        sizes: Vec<usize>,
    },
    /// `jnp.concatenate(operands, axis=dim)`: operands of one rank and element type, equal in every
    /// dimension but `dim`, placed one after another along `dim` (the last or second-to-last: lanes or
    /// sublanes).
    Concatenate {
        dim: usize,
    },
    /// `pltpu.roll(x, shift, dim)` (= `jnp.roll`): result element `i` along `dim` is the operand's
    /// element `(i - shift) mod n`. Operands: the value, the shift (an `i32` scalar, any sign).
    Roll {
        dim: usize,
    },
    /// `pltpu.bitcast(x, U)`: the operand's bits as another element type, the second-to-last dimension
    /// scaled by the ratio of the bit widths as [`OpKind::RefBitcast`] scales a ref's. Operands: the
    /// value. Result: its type says the element type and shape.
    Bitcast,
    /// `jnp.argmax` / `jnp.argmin` over `dim` of an f32 value, dropping `dim`: the `i32` index of the
    /// first maximum (minimum); a NaN counts as the extreme, so the first NaN wins (as jnp).
    ArgReduce {
        kind: ArgKind,
        dim: usize,
    },
}

/// Which extreme an [`OpKind::ArgReduce`] finds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgKind {
    Max,
    Min,
}

impl ArgKind {
    pub fn name(self) -> &'static str {
        match self {
            ArgKind::Max => "argmax",
            ArgKind::Min => "argmin",
        }
    }
}

impl OpKind {
    /// An op that maps its operands to its result element by element, all of one shape (but for a
    /// `select`'s scalar condition): the ops of the elementwise table ([`UnaryOp`], [`BinaryOp`]),
    /// comparisons, `select` and casts. The interpreter fuses, coalesces and sinks exactly these.
    pub fn is_elementwise(&self) -> bool {
        matches!(
            self,
            OpKind::Unary(_)
                | OpKind::Binary(_)
                | OpKind::Compare(_)
                | OpKind::Select
                | OpKind::Cast(_)
        )
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Op {
    pub kind: OpKind,
    pub operands: Vec<ValueId>,
    pub results: Vec<ValueId>,
    pub regions: Vec<Region>,
    pub loc: SourceLoc,
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct Region {
    pub args: Vec<ValueId>,
    pub ops: Vec<Op>,
}

/// A function: the kernel body or an index map (`transform_k`).
#[derive(Clone, Debug, PartialEq)]
pub struct Func {
    pub name: String,
    /// Every value's type, indexed by `ValueId`.
    pub values: Vec<Type>,
    /// The body; its args are the function's parameters.
    pub body: Region,
    pub result_types: Vec<Type>,
    pub loc: SourceLoc,
}

impl Func {
    pub fn ty(&self, v: ValueId) -> &Type {
        &self.values[v.0 as usize]
    }
    /// True for an index map whose results are all constants: the block never changes across the grid,
    /// so Pallas single-buffers it (`pipeline_mode = #tpu.pipeline_mode<synchronous>`).
    pub fn is_constant_map(&self) -> bool {
        let consts = self.constants();
        self.body
            .ops
            .last()
            .is_some_and(|ret| ret.operands.iter().all(|v| consts.contains(v)))
    }
    /// The values defined by `Const` ops at the top level of the body.
    pub fn constants(&self) -> Vec<ValueId> {
        self.body
            .ops
            .iter()
            .filter(|o| matches!(o.kind, OpKind::Const(_)))
            .flat_map(|o| o.results.iter().copied())
            .collect()
    }
    /// Whether the function reads a ref (an index map reading scalar-prefetch data).
    pub fn reads_refs(&self) -> bool {
        let mut found = false;
        self.walk(&mut |op| found |= matches!(op.kind, OpKind::Load(_)));
        found
    }
    /// Visit every op (pre-order, nested regions included).
    pub fn walk<'a>(&'a self, f: &mut impl FnMut(&'a Op)) {
        fn go<'a>(r: &'a Region, f: &mut impl FnMut(&'a Op)) {
            for op in &r.ops {
                f(op);
                for reg in &op.regions {
                    go(reg, f);
                }
            }
        }
        go(&self.body, f);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DimensionSemantics {
    Parallel,
    Arbitrary,
}

impl DimensionSemantics {
    pub fn mosaic(self) -> &'static str {
        match self {
            DimensionSemantics::Parallel => "parallel",
            DimensionSemantics::Arbitrary => "arbitrary",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperandRole {
    Input,
    Output,
    Scratch,
}

impl OperandRole {
    pub fn name(self) -> &'static str {
        match self {
            OperandRole::Input => "input",
            OperandRole::Output => "output",
            OperandRole::Scratch => "scratch",
        }
    }
}

/// How a whole array is windowed into blocks.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockIr {
    /// Block shape as written (squeezed dims have size 1 here).
    pub block_shape: Vec<usize>,
    pub squeezed: Vec<bool>,
    /// `transform_k(grid indices...) -> block indices...`
    pub index_map: Func,
}

impl BlockIr {
    /// The shape the kernel sees (squeezed dims removed).
    pub fn kernel_shape(&self) -> Vec<usize> {
        self.block_shape
            .iter()
            .zip(&self.squeezed)
            .filter(|(_, s)| !**s)
            .map(|(n, _)| *n)
            .collect()
    }
}

/// One kernel operand: an input/output array with its BlockSpec, or a scratch buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct Operand {
    pub role: OperandRole,
    /// Index among operands of the same role.
    pub index: usize,
    /// The whole array (inputs/outputs) or the buffer shape (scratch).
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub space: MemSpace,
    /// `None` for scratch and for whole-array (`ANY`) operands.
    pub block: Option<BlockIr>,
    /// Where the launch code declared this operand.
    pub loc: SourceLoc,
}

impl Operand {
    pub fn label(&self) -> String {
        format!("{} {}", self.role.name(), self.index)
    }
    /// The ref shape the kernel body sees.
    pub fn ref_shape(&self) -> Vec<usize> {
        match &self.block {
            Some(b) => b.kernel_shape(),
            None => self.shape.clone(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct CostEstimate {
    pub flops: u64,
    pub transcendentals: u64,
    pub bytes_accessed: u64,
}

/// A traced, checked kernel with its launch configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub name: String,
    pub grid: Vec<usize>,
    pub dimension_semantics: Vec<DimensionSemantics>,
    /// Inputs, then outputs, then scratch — the kernel's parameter order after the grid indices.
    pub operands: Vec<Operand>,
    /// The first `scalar_prefetch` inputs are scalar-prefetch operands (Pallas's
    /// `PrefetchScalarGridSpec`): whole i32 arrays placed in SMEM before the grid runs, passed to the
    /// body and to every index map (after the grid indices).
    pub scalar_prefetch: usize,
    /// `(input, output)` pairs whose buffers are one (`input_output_aliases`): the output starts as
    /// the input's contents and the kernel updates it in place.
    pub aliases: Vec<(usize, usize)>,
    pub body: Func,
    pub vmem_limit_bytes: Option<u64>,
    pub cost_estimate: Option<CostEstimate>,
    /// The TPU generation it is built for: the VMEM check's limits, the scoped VMEM limit the
    /// backend_config carries, and any lowering rule that differs per generation read it.
    pub target: crate::target::Target,
    /// libtpu's run-time checks the custom call turns off (Pallas's `CompilerParams(
    /// disable_bounds_checks=.., disable_semaphore_checks=..)`): they cost code around every copy;
    /// the CPU engines check everything regardless.
    pub disable_bounds_checks: bool,
    pub disable_semaphore_checks: bool,
    /// The whole-array (`Any`) operands pinned to HBM (Pallas's `pltpu.HBM` over `pl.ANY`): XLA may
    /// otherwise place a small one in VMEM, where its copies become vector load/store loops.
    pub any_in_hbm: bool,
    /// The device mesh it runs over (`jax.shard_map`'s): what `axis_index` and remote device ids are
    /// traced against; `None` for a kernel that knows no mesh.
    pub mesh: Option<crate::mesh::Mesh>,
    /// The collective id of its barrier semaphore (Pallas's `CompilerParams(collective_id=..)`).
    pub collective_id: Option<u32>,
}

impl Kernel {
    pub fn inputs(&self) -> impl Iterator<Item = &Operand> {
        self.operands
            .iter()
            .filter(|o| o.role == OperandRole::Input)
    }
    pub fn outputs(&self) -> impl Iterator<Item = &Operand> {
        self.operands
            .iter()
            .filter(|o| o.role == OperandRole::Output)
    }
    /// The scalar-prefetch operands (the first inputs).
    pub fn prefetch(&self) -> impl Iterator<Item = &Operand> {
        self.operands.iter().take(self.scalar_prefetch)
    }
    /// Whether the body talks to other devices (remote copies or signals, the barrier semaphore):
    /// the custom call's `has_communication`.
    pub fn communicates(&self) -> bool {
        fn any(r: &Region) -> bool {
            r.ops.iter().any(|op| {
                matches!(
                    op.kind,
                    OpKind::RemoteDmaStart
                        | OpKind::RemoteDmaWait { .. }
                        | OpKind::SemSignalRemote
                        | OpKind::BarrierSemaphore
                ) || op.regions.iter().any(any)
            })
        }
        any(&self.body.body)
    }
    pub fn scratch(&self) -> impl Iterator<Item = &Operand> {
        self.operands
            .iter()
            .filter(|o| o.role == OperandRole::Scratch)
    }
}
