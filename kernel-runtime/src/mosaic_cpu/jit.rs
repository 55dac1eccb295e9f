//! The rewritten (upstream-only) module → LLVM through MLIR's standard conversions → machine code
//! through MLIR's `ExecutionEngine` (called through `mlir-sys`, so a module that fails translation is
//! an error here, not a null engine dereferenced later).
//!
//! Vector values are `memref.alloc`s; the conversion calls `_mlir_memref_to_llvm_alloc` for them
//! (`use-generic-functions`), which is bound to a per-thread bump arena that the driver resets after
//! every grid step — values never outlive a step (refs are the driver's own buffers; a `run_scoped`
//! scope's buffers are allocated at the kernel function's entry, so they live for one step too).
//! The vector math's functions the module calls (`math.rs`) are bound to their shims the same way.

use crate::error::{kerr, Result};
use melior::dialect::DialectHandle;
use melior::ir::operation::OperationLike;
use melior::ir::Module;
use melior::pass::PassManager;
use melior::Context;
use std::cell::RefCell;
use std::ffi::c_void;
use std::rc::Rc;
use std::sync::Once;

/// The lowering pipeline: the rewritten module computes nothing in bf16 (`scalar.rs` runs every bf16
/// op in f32 and rounds with the vector math, as the interpreter does), so only its exact widenings
/// `bf16 → f32` remain, expanded to integer code (no compiler-rt calls); then the standard
/// conversions to the LLVM dialect. No `math` op becomes a libm call: the ones the vector math
/// defines are its calls already (`math.rs`), the rest (`sqrt`, `absf`) are exact LLVM intrinsics, and
/// a `math` op that is neither, or any bf16 arithmetic left, fails to lower, naming it.
const PIPELINE: &str = "builtin.module(\
    canonicalize,\
    func.func(arith-expand{include-bf16=true}),\
    convert-scf-to-cf,\
    convert-math-to-llvm,\
    convert-arith-to-llvm,\
    finalize-memref-to-llvm{use-generic-functions=true},\
    convert-func-to-llvm{use-bare-ptr-memref-call-conv=true},\
    convert-cf-to-llvm,\
    convert-ub-to-llvm,\
    reconcile-unrealized-casts)";

/// LLVM optimization level of the JIT. 0: measured on the examples, O1–O3 compile 5–40× slower
/// (softmax 15 ms at O0, 330 ms at O2) and run no faster — the time of a run is the host's block
/// copies, and the engine is a proof, not a speed path.
const OPT_LEVEL: i32 = 0;

fn new_context() -> Context {
    let ctx = Context::new();
    let handles = [
        DialectHandle::func(),
        DialectHandle::arith(),
        DialectHandle::memref(),
        DialectHandle::scf(),
        DialectHandle::cf(),
        DialectHandle::llvm(),
        // SAFETY: returns a static dialect handle from the MLIR C API.
        unsafe { DialectHandle::from_raw(mlir_sys::mlirGetDialectHandle__math__()) },
    ];
    for h in handles {
        h.register_dialect(&ctx);
        h.load_dialect(&ctx);
    }
    ctx.enable_multi_threading(false);
    ctx
}

thread_local! {
    /// The context rewritten modules are parsed, lowered and translated in (separate from the
    /// lowering context, which never loads LLVM).
    static CONTEXT: Context = new_context();
}

/// Register (once per process) exactly the passes of [`PIPELINE`].
fn register_passes() {
    static ONCE: Once = Once::new();
    // SAFETY: pass registration functions of the MLIR C API; they only add to MLIR's global pass
    // registry, and `Once` keeps them from racing.
    ONCE.call_once(|| unsafe {
        mlir_sys::mlirRegisterTransformsCanonicalizer();
        mlir_sys::mlirRegisterArithArithExpandOpsPass();
        mlir_sys::mlirRegisterConversionSCFToControlFlowPass();
        mlir_sys::mlirRegisterConversionConvertMathToLLVMPass();
        mlir_sys::mlirRegisterConversionArithToLLVMConversionPass();
        mlir_sys::mlirRegisterConversionFinalizeMemRefToLLVMConversionPass();
        mlir_sys::mlirRegisterConversionConvertFuncToLLVMPass();
        mlir_sys::mlirRegisterConversionConvertControlFlowToLLVMPass();
        mlir_sys::mlirRegisterConversionUBToLLVMConversionPass();
        mlir_sys::mlirRegisterConversionReconcileUnrealizedCastsPass();
    });
}

/// A function's packed entry point (`_mlir_<name>`): one pointer per argument, then one per result.
pub(super) type Packed = unsafe extern "C" fn(*mut *mut c_void);

/// A compiled module.
pub(super) struct Jit {
    raw: mlir_sys::MlirExecutionEngine,
}

impl Drop for Jit {
    fn drop(&mut self) {
        // SAFETY: `raw` is a live engine created in `compile` (never null) and dropped once.
        unsafe { mlir_sys::mlirExecutionEngineDestroy(self.raw) }
    }
}

/// Run `f` in the JIT context with its diagnostics collected; an error carries them.
fn with_diagnostics<R>(f: impl FnOnce(&Context) -> Result<R>) -> Result<R> {
    CONTEXT.with(|ctx| {
        let seen = Rc::new(RefCell::new(Vec::<String>::new()));
        let sink = seen.clone();
        let id = ctx.attach_diagnostic_handler(move |d| {
            sink.borrow_mut().push(d.to_string());
            true
        });
        let r = f(ctx);
        ctx.detach_diagnostic_handler(id);
        r.map_err(|mut e| {
            let seen = seen.borrow();
            if !seen.is_empty() {
                e.message += &format!("\nMLIR says:\n  {}", seen.join("\n  "));
            }
            e
        })
    })
}

impl Jit {
    /// Parse, lower and JIT-compile the module `text`.
    pub fn compile(text: &str) -> Result<Jit> {
        register_passes();
        with_diagnostics(|ctx| {
            let mut module = Module::parse(ctx, text).ok_or_else(|| {
                kerr!(
                    Lowering,
                    "mosaic_cpu: the rewritten module does not parse (a tpu-kernel bug):\n{text}"
                )
            })?;
            if !module.as_operation().verify() {
                return Err(kerr!(
                    Lowering,
                    "mosaic_cpu: the rewritten module does not verify (a tpu-kernel bug):\n{text}"
                ));
            }
            let pm = PassManager::new(ctx);
            melior::utility::parse_pass_pipeline(pm.as_operation_pass_manager(), PIPELINE)
                .map_err(|e| kerr!(Lowering, "mosaic_cpu: the pass pipeline: {e}"))?;
            pm.run(&mut module).map_err(|e| {
                kerr!(
                    Lowering,
                    "mosaic_cpu: lowering the rewritten module to LLVM failed ({e}):\n{text}"
                )
            })?;
            // SAFETY: `module` is a live module of this context, lowered to the LLVM dialect; the engine
            // translates it during the call and keeps no reference to it.
            let raw = unsafe {
                mlir_sys::mlirExecutionEngineCreate(
                    module.to_raw(),
                    OPT_LEVEL,
                    0,
                    std::ptr::null(),
                    false,
                    false,
                )
            };
            if raw.ptr.is_null() {
                return Err(kerr!(
                    Lowering,
                    "mosaic_cpu: MLIR could not translate or JIT-compile the lowered module"
                ));
            }
            let jit = Jit { raw };
            // SAFETY: `arena_alloc` has the signature the memref conversion declares for
            // `_mlir_memref_to_llvm_alloc` (`ptr (i64)`), lives for the whole process, and never unwinds.
            unsafe { jit.register("_mlir_memref_to_llvm_alloc", arena_alloc as *mut c_void) };
            for (symbol, shim) in super::math::symbols() {
                // SAFETY: each shim has the C signature `math.rs` declares for its symbol (`f32`
                // operands; an `f32` result, `i16` for the bf16 rounding), lives for the whole
                // process, and never unwinds.
                unsafe { jit.register(symbol, shim) };
            }
            Ok(jit)
        })
    }

    /// Bind the external symbol `name` the module calls to `address`.
    ///
    /// # Safety
    /// `address` must be a function with the signature the module declares for `name`, alive as long
    /// as the engine.
    unsafe fn register(&self, name: &str, address: *mut c_void) {
        // SAFETY: `raw` is a live engine; the name is passed with its length (no terminator needed);
        // the address by the caller.
        unsafe {
            mlir_sys::mlirExecutionEngineRegisterSymbol(
                self.raw,
                mlir_sys::MlirStringRef {
                    data: name.as_ptr() as *const _,
                    length: name.len(),
                },
                address,
            )
        }
    }

    /// The packed entry point of function `name` (compiles it on first lookup).
    pub fn packed(&self, name: &str) -> Result<Packed> {
        // SAFETY: `raw` is a live engine; the name is passed with its length (no terminator needed).
        let ptr = unsafe {
            mlir_sys::mlirExecutionEngineLookupPacked(
                self.raw,
                mlir_sys::MlirStringRef {
                    data: name.as_ptr() as *const _,
                    length: name.len(),
                },
            )
        };
        if ptr.is_null() {
            return Err(kerr!(
                Lowering,
                "mosaic_cpu: the JIT has no function `{name}` (an unresolved symbol?)"
            ));
        }
        // SAFETY: a non-null packed entry point has exactly the `Packed` ABI (MLIR's ExecutionEngine
        // generates `void _mlir_<name>(void **)` for every function).
        Ok(unsafe { std::mem::transmute::<*mut c_void, Packed>(ptr) })
    }
}

/// Per-thread bump allocation for the JIT'd code's `memref.alloc`s: chunks kept across steps.
struct Arena {
    chunks: Vec<Vec<u128>>,
    /// Chunk being filled and bytes used in it.
    current: usize,
    used: usize,
}

const CHUNK_BYTES: usize = 1 << 20;

thread_local! {
    static ARENA: RefCell<Arena> = const {
        RefCell::new(Arena {
            chunks: Vec::new(),
            current: 0,
            used: 0,
        })
    };
}

impl Arena {
    fn alloc(&mut self, size: usize) -> *mut c_void {
        let size = size.max(1).div_ceil(16) * 16;
        loop {
            if let Some(chunk) = self.chunks.get_mut(self.current) {
                let cap = chunk.len() * 16;
                if self.used + size <= cap {
                    let p = chunk.as_mut_ptr() as *mut u8;
                    // SAFETY: `used + size <= cap`: the pointer stays inside the chunk's allocation.
                    let p = unsafe { p.add(self.used) };
                    self.used += size;
                    return p as *mut c_void;
                }
                self.current += 1;
                self.used = 0;
                continue;
            }
            self.chunks.push(vec![0u128; size.max(CHUNK_BYTES) / 16]);
            self.current = self.chunks.len() - 1;
            self.used = 0;
        }
    }
}

/// `_mlir_memref_to_llvm_alloc` for the JIT'd code: 16-byte aligned memory valid until
/// [`reset_arena`].
extern "C" fn arena_alloc(size: u64) -> *mut c_void {
    ARENA.with(|a| match a.try_borrow_mut() {
        Ok(mut a) => a.alloc(size as usize),
        Err(_) => std::ptr::null_mut(),
    })
}

/// Free everything the JIT'd code allocated on this thread (after a grid step; its values are dead).
pub(super) fn reset_arena() {
    ARENA.with(|a| {
        if let Ok(mut a) = a.try_borrow_mut() {
            a.current = 0;
            a.used = 0;
            // Keep the first few chunks for the next step; give back the rest.
            a.chunks.truncate(4);
        }
    });
}
