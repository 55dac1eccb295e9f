//! The TPU generation a kernel is built for: one row per generation, with the facts the checks, the
//! lowering and a kernel's launch function read.
//!
//! A launch names its target with `pallas_call(k).target(Target::V6e)`; without one it builds for the
//! target in scope ([`Target::scope`]: the export path scopes the request's target, the example
//! command line `--target`), else for [`Target::DEFAULT`] (v5e). The target travels in the kernel IR
//! (`ir::Kernel::target`): the VMEM check reads its limits, a lowering rule that differs per
//! generation matches on it (none does today: Pallas emits the same module and backend_config for
//! every generation for our kernels), and the backend_config carries its scoped VMEM limit.
//!
//! Adding a generation is one row of `targets!` (and its facts measured, not guessed: every figure
//! below names its source). Sources:
//! - jax 0.12 `jax/_src/tpu_info.py`: `chip_version_from_device_kind` (device kinds),
//!   `_get_tpu_info_impl` (VMEM/SMEM capacity per core, MXU column size and count, TensorCores per
//!   chip), `TpuInfo.is_matmul_supported` (MXU input dtypes);
//! - jax's Mosaic `canonicalize_mosaic.cc` (`hardware_generation` checks): bf16 elementwise and
//!   reductions cast to f32 on generation <= 5 ("TPUv6+ have native bf16 ALU ops support"), 16-bit
//!   vector addition "only supported on hardware generation v6+";
//! - measured with libtpu 0.0.51 on this project's machines (`../shared/TOOLCHAIN.md`, and
//!   `python/tests/test_examples.py`/`test_agreement.py`/`test_jax_targets.py` keep them honest): the
//!   topology names libtpu accepts, the matmul dtypes it compiles, the default scoped VMEM limit (a Pallas copy kernel's largest double-buffered blocks
//!   without `vmem_limit_bytes`), and the VMEM a kernel's blocks may use with a limit above the
//!   capacity (libtpu keeps 64 KiB of it on v5p, v6e and tpu7x: "Used 64.00M of 63.94M vmem").

use crate::dtype::DType;
use crate::error::{kerr, Result};
use std::cell::Cell;
use std::fmt;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
/// Every dtype `dot` takes (`DotElement`).
const ALL_MATMUL: &[DType] = &[
    DType::F32,
    DType::BF16,
    DType::I8,
    DType::F8E4M3FN,
    DType::F8E5M2,
    DType::I4,
];
/// The storage dtypes (`DTypeOps::Storage`) libtpu 0.0.51 loads, stores and casts to and from
/// f32/bf16 on every generation (measured: `python/probe_dtypes.py`). f16 is not among them: libtpu
/// refuses every f16 vector, a copy included ("Invalid vector type for load"), on v4 to tpu7x.
/// int4 (packed eight to a 32-bit word) too: loads, stores, casts to and from f32/bf16/i32/i8 on
/// every generation; its arithmetic nowhere ("Only vector<i16> and vector<i32> are supported, but got
/// 'i4'").
const STORAGE_ALL: &[DType] = &[DType::F8E4M3FN, DType::F8E5M2, DType::I4];

/// Which dtype pairs a generation's MXU takes without a cast (jax's `TpuInfo.is_matmul_supported`,
/// restricted to the dtypes kernels have). libtpu compiles other pairs too (it converts them first):
/// this is what a launch function reads to pick a formulation, not a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MxuInputs {
    /// v4: an f32/bf16 lhs times an f32/bf16/i8 rhs.
    FloatTimesFloatOrI8,
    /// v5e, v5p, v6e: f32/bf16 × f32/bf16, or i8/u8 × i8/u8.
    FloatOrInt8Pairs,
    /// tpu7x: f32/bf16 × f32/bf16 (its 8-bit inputs are fp8, which kernels do not have).
    Float,
}

impl MxuInputs {
    pub fn native(self, lhs: DType, rhs: DType) -> bool {
        let float = |d: DType| matches!(d, DType::F32 | DType::BF16);
        let int8 = |d: DType| matches!(d, DType::I8 | DType::U8);
        match self {
            MxuInputs::FloatTimesFloatOrI8 => float(lhs) && (float(rhs) || rhs == DType::I8),
            MxuInputs::FloatOrInt8Pairs => (float(lhs) && float(rhs)) || (int8(lhs) && int8(rhs)),
            MxuInputs::Float => float(lhs) && float(rhs),
        }
    }
}

/// One generation's facts (a row of the table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetInfo {
    /// The name kernels, the command line and the JAX op use (`"v5e"`).
    pub name: &'static str,
    /// jax's `TpuInfo.generation`.
    pub generation: u32,
    /// The smallest topology libtpu 0.0.51 compiles this generation for (`get_topology_desc(name,
    /// "tpu")`; v4 and v5p have none smaller than 2x2x1): what `--check` and the test suite compile for.
    pub topology: &'static str,
    /// The jax `device_kind`s of this generation (`jax.devices()[0].device_kind`; a topology's
    /// devices report the first).
    pub device_kinds: &'static [&'static str],
    /// TensorCores per chip (jax's `num_physical_tensor_cores_per_chip`).
    pub tensor_cores_per_chip: u32,
    /// VMEM per TensorCore (jax's `vmem_capacity_bytes`).
    pub vmem_capacity_bytes: u64,
    /// What a kernel's blocks and scratch may use of it, with any `vmem_limit_bytes` (measured).
    pub vmem_usable_bytes: u64,
    /// libtpu's scoped VMEM limit when the launch sets none (measured): our default `vmem_limit_bytes`.
    pub default_scoped_vmem_bytes: u64,
    /// SMEM per TensorCore (jax's `smem_capacity_bytes`).
    pub smem_capacity_bytes: u64,
    /// The MXU is `mxu_size × mxu_size` (jax's `mxu_column_size`): the natural multiple of a matmul
    /// block's dimensions.
    pub mxu_size: usize,
    /// MXUs per TensorCore (jax's `num_mxus`).
    pub mxus: u32,
    pub mxu_inputs: MxuInputs,
    /// The `dot` operand dtypes libtpu compiles a matmul of (measured: 128² blocks, plain and
    /// transposed, f32 and bf16 into f32, i8 into i32; `python/probe_dtypes.py` for the 8-bit floats
    /// into f32 and int4 × int4 into i32). v4 refuses i8 × i8, fp8 × fp8 and int4 × int4 ("E2001:
    /// Unsupported matmul RHS type"); tpu7x
    /// compiles i8 though its MXU takes no int8 (`mxu_inputs`), and v5e/v5p/v6e compile fp8 though
    /// theirs take none (libtpu converts).
    pub matmul_dtypes: &'static [DType],
    /// The storage dtypes (the dtype table's `Storage` rows) libtpu compiles loads, stores and casts
    /// of on this generation (measured: `python/probe_dtypes.py`); a kernel holding another is
    /// refused at `build()`.
    pub storage_dtypes: &'static [DType],
    /// bf16 elementwise ops and reductions run in bf16 on the VPU (Mosaic casts them to f32 below v6).
    pub bf16_vpu: bool,
    /// 16-bit integer vector arithmetic (tpu-inference's int16 mask arithmetic on v6+).
    pub i16_vpu: bool,
    /// libtpu masks 8-bit elements within a word: a rank-1 8-bit block equal to its whole array need
    /// not be a multiple of its 512-element tile. v4 refuses one ("8-bit subelement masking is only
    /// supported for TPU v5+", measured with whole arrays of 128, 640 and 2000 i8/u8; 512, 1024, 1536
    /// and 512-blocks of 3000 compile).
    pub masks_8bit: bool,
}

macro_rules! targets {
    ($( $(#[doc = $doc:literal])* $V:ident = $row:expr, )*) => {
        /// A TPU generation (see the module docs). `Target::DEFAULT` is v5e.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Target { $( $(#[doc = $doc])* $V, )* }

        impl Target {
            /// Every target, oldest first.
            pub const ALL: &'static [Target] = &[$(Target::$V),*];
            /// This generation's facts.
            pub const fn info(self) -> &'static TargetInfo {
                match self { $( Target::$V => &$row, )* }
            }
        }
    };
}

targets! {
    /// TPU v4 (2 TensorCores per chip; libtpu's smallest topology is `v4:2x2x1`).
    V4 = TargetInfo {
        name: "v4", generation: 4, topology: "v4:2x2x1", device_kinds: &["TPU v4"],
        tensor_cores_per_chip: 2, vmem_capacity_bytes: 16 * MIB, vmem_usable_bytes: 16 * MIB,
        default_scoped_vmem_bytes: 16 * MIB, smem_capacity_bytes: MIB, mxu_size: 128, mxus: 4,
        mxu_inputs: MxuInputs::FloatTimesFloatOrI8, matmul_dtypes: &[DType::F32, DType::BF16],
        storage_dtypes: STORAGE_ALL, bf16_vpu: false, i16_vpu: false, masks_8bit: false,
    },
    /// TPU v5e ("v5 lite"; one TensorCore per chip).
    V5e = TargetInfo {
        name: "v5e", generation: 5, topology: "v5e:1x1", device_kinds: &["TPU v5 lite", "TPU v5e"],
        tensor_cores_per_chip: 1, vmem_capacity_bytes: 128 * MIB, vmem_usable_bytes: 128 * MIB,
        default_scoped_vmem_bytes: 16 * MIB, smem_capacity_bytes: MIB, mxu_size: 128, mxus: 4,
        mxu_inputs: MxuInputs::FloatOrInt8Pairs, matmul_dtypes: ALL_MATMUL,
        storage_dtypes: STORAGE_ALL, bf16_vpu: false, i16_vpu: false, masks_8bit: true,
    },
    /// TPU v5p (2 TensorCores per chip; libtpu's smallest topology is `v5p:2x2x1`).
    V5p = TargetInfo {
        name: "v5p", generation: 5, topology: "v5p:2x2x1", device_kinds: &["TPU v5", "TPU v5p"],
        tensor_cores_per_chip: 2, vmem_capacity_bytes: 64 * MIB, vmem_usable_bytes: 64 * MIB - 64 * KIB,
        default_scoped_vmem_bytes: 16 * MIB, smem_capacity_bytes: MIB, mxu_size: 128, mxus: 4,
        mxu_inputs: MxuInputs::FloatOrInt8Pairs, matmul_dtypes: ALL_MATMUL,
        storage_dtypes: STORAGE_ALL, bf16_vpu: false, i16_vpu: false, masks_8bit: true,
    },
    /// TPU v6e ("v6 lite"; one TensorCore per chip).
    V6e = TargetInfo {
        name: "v6e", generation: 6, topology: "v6e:1x1", device_kinds: &["TPU v6 lite", "TPU v6e"],
        tensor_cores_per_chip: 1, vmem_capacity_bytes: 128 * MIB, vmem_usable_bytes: 128 * MIB - 64 * KIB,
        default_scoped_vmem_bytes: 32 * MIB, smem_capacity_bytes: MIB, mxu_size: 256, mxus: 2,
        mxu_inputs: MxuInputs::FloatOrInt8Pairs, matmul_dtypes: ALL_MATMUL,
        storage_dtypes: STORAGE_ALL, bf16_vpu: true, i16_vpu: true, masks_8bit: true,
    },
    /// TPU7x (2 TensorCores per chip, each its own device: `tpu7x:1x1x1` has two).
    Tpu7x = TargetInfo {
        name: "tpu7x", generation: 7, topology: "tpu7x:1x1x1", device_kinds: &["TPU7x"],
        tensor_cores_per_chip: 2, vmem_capacity_bytes: 64 * MIB, vmem_usable_bytes: 64 * MIB - 64 * KIB,
        default_scoped_vmem_bytes: 32 * MIB, smem_capacity_bytes: MIB, mxu_size: 256, mxus: 2,
        mxu_inputs: MxuInputs::Float, matmul_dtypes: ALL_MATMUL,
        storage_dtypes: STORAGE_ALL, bf16_vpu: true, i16_vpu: true, masks_8bit: true,
    },
}

thread_local! {
    static SCOPED: Cell<Option<Target>> = const { Cell::new(None) };
}

impl Target {
    /// What a launch builds for when nothing names a target (what this repository checks by default).
    pub const DEFAULT: Target = Target::V5e;

    pub const fn name(self) -> &'static str {
        self.info().name
    }

    /// A target by its name (`"v6e"`, any case) or by a jax `device_kind` (`"TPU v6 lite"`); an error
    /// listing the targets otherwise.
    pub fn parse(s: &str) -> Result<Target> {
        let t = s.trim();
        Target::ALL
            .iter()
            .copied()
            .find(|x| x.name().eq_ignore_ascii_case(t))
            .or_else(|| Target::from_device_kind(t))
            .ok_or_else(|| {
                kerr!(
                    Unsupported,
                    "unknown TPU target `{s}`; the targets are {} (or a jax device_kind such as \"TPU v6 lite\")",
                    Target::names().join(", ")
                )
            })
    }

    /// The target of a jax `device_kind` (`jax.devices()[0].device_kind`), if tpu-kernel has one.
    pub fn from_device_kind(kind: &str) -> Option<Target> {
        Target::ALL
            .iter()
            .copied()
            .find(|t| t.info().device_kinds.contains(&kind))
    }

    /// Every target's name, oldest first.
    pub fn names() -> Vec<&'static str> {
        Target::ALL.iter().map(|t| t.name()).collect()
    }

    /// The target launches built on this thread use when they name none: the innermost
    /// [`Target::scope`], else [`Target::DEFAULT`].
    pub fn current() -> Target {
        SCOPED.with(Cell::get).unwrap_or(Target::DEFAULT)
    }

    /// Run `f` with `self` as the target of every launch it builds without `.target(..)` (as Pallas
    /// reads the generation from the device or the abstract mesh in scope): how the export path
    /// applies a request's target to a launch function, and the example command line `--target`.
    pub fn scope<R>(self, f: impl FnOnce() -> R) -> R {
        scoped(&SCOPED, self, f)
    }
}

thread_local! {
    static EXECUTOR: Cell<Option<Executor>> = const { Cell::new(None) };
}

/// Run `f` with `value` in thread-local `slot`, the previous value restored after it (a panic too).
fn scoped<T: Copy + 'static, R>(
    slot: &'static std::thread::LocalKey<Cell<Option<T>>>,
    value: T,
    f: impl FnOnce() -> R,
) -> R {
    struct Restore<T: Copy + 'static>(&'static std::thread::LocalKey<Cell<Option<T>>>, Option<T>);
    impl<T: Copy + 'static> Drop for Restore<T> {
        fn drop(&mut self) {
            self.0.with(|s| s.set(self.1));
        }
    }
    let _restore = Restore(slot, slot.with(|s| s.replace(Some(value))));
    f()
}

/// What will run the kernel a launch builds: a TPU (the default, what every check holds it to), or
/// this machine's CPU (the interpreter: the JAX op's CPU lowering builds its launches in
/// `Executor::Cpu.scope`). A launch function may read [`Executor::current`] to pick what does not
/// change its results but costs the two differently — a block size that pads short rows costs a
/// TPU nothing it can use and the CPU every padded row. The kernel is the same kernel either way: a
/// launch built for the CPU compiles for its target too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Executor {
    /// A TPU of the launch's [`Target`].
    #[default]
    Tpu,
    /// The CPU: the interpreter (or the emitted Mosaic run on the CPU).
    Cpu,
}

impl Executor {
    /// The executor launches built on this thread are built for: the innermost
    /// [`Executor::scope`], else [`Executor::Tpu`].
    pub fn current() -> Executor {
        EXECUTOR.with(Cell::get).unwrap_or_default()
    }

    /// Run `f` with `self` as the executor of every launch it builds.
    pub fn scope<R>(self, f: impl FnOnce() -> R) -> R {
        scoped(&EXECUTOR, self, f)
    }

    /// Every executor.
    pub const ALL: [Executor; 2] = [Executor::Tpu, Executor::Cpu];

    /// `"tpu"` or `"cpu"` (the export request's `"executor"`).
    pub const fn name(self) -> &'static str {
        match self {
            Executor::Tpu => "tpu",
            Executor::Cpu => "cpu",
        }
    }

    /// The executor named `s` (its [`name`](Executor::name)).
    pub fn from_name(s: &str) -> Option<Executor> {
        Executor::ALL.into_iter().find(|e| e.name() == s)
    }
}

impl Default for Target {
    fn default() -> Self {
        Target::DEFAULT
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Target {
    type Err = crate::error::KernelError;
    fn from_str(s: &str) -> Result<Target> {
        Target::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_in_enum_order_and_names_are_unique() {
        for (i, t) in Target::ALL.iter().enumerate() {
            assert_eq!(*t as usize, i);
            assert_eq!(Target::parse(t.name()).unwrap(), *t);
            assert_eq!(Target::parse(&t.name().to_uppercase()).unwrap(), *t);
            for k in t.info().device_kinds {
                assert_eq!(Target::from_device_kind(k), Some(*t));
            }
            assert!(t.info().default_scoped_vmem_bytes <= t.info().vmem_usable_bytes);
            assert!(t.info().vmem_usable_bytes <= t.info().vmem_capacity_bytes);
        }
        let mut names = Target::names();
        names.dedup();
        assert_eq!(names.len(), Target::ALL.len());
    }

    #[test]
    fn unknown_names_list_the_targets() {
        let e = Target::parse("v7x").unwrap_err();
        assert!(
            e.message.contains("v4, v5e, v5p, v6e, tpu7x"),
            "{}",
            e.message
        );
        assert_eq!(Target::parse("TPU v5 lite").unwrap(), Target::V5e);
        assert_eq!(Target::from_device_kind("cpu"), None);
    }

    #[test]
    fn scopes_nest_and_restore() {
        assert_eq!(Target::current(), Target::DEFAULT);
        Target::V6e.scope(|| {
            assert_eq!(Target::current(), Target::V6e);
            Target::Tpu7x.scope(|| assert_eq!(Target::current(), Target::Tpu7x));
            assert_eq!(Target::current(), Target::V6e);
            let caught = std::panic::catch_unwind(|| Target::V4.scope(|| panic!("inside")));
            assert!(caught.is_err());
            assert_eq!(Target::current(), Target::V6e);
        });
        assert_eq!(Target::current(), Target::DEFAULT);
    }

    #[test]
    fn executor_scopes_nest_and_restore() {
        assert_eq!(Executor::current(), Executor::Tpu);
        Executor::Cpu.scope(|| {
            assert_eq!(Executor::current(), Executor::Cpu);
            Executor::Tpu.scope(|| assert_eq!(Executor::current(), Executor::Tpu));
            let caught = std::panic::catch_unwind(|| Executor::Tpu.scope(|| panic!("inside")));
            assert!(caught.is_err());
            assert_eq!(Executor::current(), Executor::Cpu);
        });
        assert_eq!(Executor::current(), Executor::Tpu);
    }

    #[test]
    fn mxu_inputs_follow_jax() {
        use DType::*;
        assert!(Target::V5e.info().mxu_inputs.native(I8, I8));
        assert!(!Target::Tpu7x.info().mxu_inputs.native(I8, I8));
        assert!(Target::Tpu7x.info().mxu_inputs.native(BF16, F32));
        assert!(Target::V4.info().mxu_inputs.native(BF16, I8));
        assert!(!Target::V4.info().mxu_inputs.native(I8, I8));
    }
}
