//! One long-lived MLIR context per thread with the dialects Mosaic modules use (func, arith, math, memref,
//! scf, vector registered; `tpu` left unregistered — its ops are built generically and verified by jaxlib).

use melior::dialect::DialectHandle;
use melior::Context;

fn new_context() -> Context {
    let ctx = Context::new();
    let handles = [
        DialectHandle::func(),
        DialectHandle::arith(),
        DialectHandle::memref(),
        DialectHandle::scf(),
        // SAFETY: these return static dialect handles from the MLIR C API.
        unsafe { DialectHandle::from_raw(mlir_sys::mlirGetDialectHandle__vector__()) },
        unsafe { DialectHandle::from_raw(mlir_sys::mlirGetDialectHandle__math__()) },
    ];
    for h in handles {
        h.register_dialect(&ctx);
        h.load_dialect(&ctx);
    }
    ctx.set_allow_unregistered_dialects(true);
    ctx
}

thread_local! {
    static CONTEXT: Context = new_context();
}

/// Run `f` with this thread's MLIR context.
pub fn with_context<R>(f: impl FnOnce(&Context) -> R) -> R {
    CONTEXT.with(|ctx| f(ctx))
}
