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
    // Modules are small and built one per call: MLIR's thread pool (parallel verification) costs more
    // in wake-ups than it saves (measured: verification dominated the lowering of a small kernel).
    ctx.enable_multi_threading(false);
    ctx
}

thread_local! {
    static CONTEXT: Context = new_context();
}

/// Run `f` with this thread's MLIR context.
pub fn with_context<R>(f: impl FnOnce(&Context) -> R) -> R {
    CONTEXT.with(|ctx| f(ctx))
}

/// Parsed types and attributes by their text, per context. MLIR uniques types and attributes and
/// keeps them for the context's whole life, so a handle parsed once stays valid and equal to a fresh
/// parse; the per-thread contexts live as long as their thread. Parsing (a lexer, a parser, a source
/// manager per call) was most of the cost of building a small module.
mod memo {
    use melior::ir::{Attribute, AttributeLike, Type, TypeLike};
    use melior::Context;
    use mlir_sys::{MlirAttribute, MlirContext, MlirType};
    use std::cell::RefCell;
    use std::collections::HashMap;

    thread_local! {
        static TYPES: RefCell<HashMap<(usize, String), MlirType>> = RefCell::new(HashMap::new());
        static ATTRS: RefCell<HashMap<(usize, String), MlirAttribute>> = RefCell::new(HashMap::new());
    }

    fn key(ctx: &Context, text: &str) -> (usize, String) {
        let raw: MlirContext = ctx.to_raw();
        (raw.ptr as usize, text.to_string())
    }

    pub fn memo_type<'c>(ctx: &'c Context, text: &str) -> Option<Type<'c>> {
        let k = key(ctx, text);
        if let Some(raw) = TYPES.with(|m| m.borrow().get(&k).copied()) {
            // SAFETY: parsed in this very context (the key holds its address), which is alive (`ctx`).
            return Some(unsafe { Type::from_raw(raw) });
        }
        let t = Type::parse(ctx, text)?;
        TYPES.with(|m| m.borrow_mut().insert(k, t.to_raw()));
        Some(t)
    }

    pub fn memo_attr<'c>(ctx: &'c Context, text: &str) -> Option<Attribute<'c>> {
        let k = key(ctx, text);
        if let Some(raw) = ATTRS.with(|m| m.borrow().get(&k).copied()) {
            // SAFETY: as for types.
            return Some(unsafe { Attribute::from_raw(raw) });
        }
        let a = Attribute::parse(ctx, text)?;
        ATTRS.with(|m| m.borrow_mut().insert(k, a.to_raw()));
        Some(a)
    }
}
pub(crate) use memo::{memo_attr, memo_type};
