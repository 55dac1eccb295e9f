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
        // SAFETY: as above.
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

/// Parsed attributes by their text, per context. MLIR uniques attributes and types and keeps them for the
/// context's whole life, so a handle parsed once stays valid and equal to a fresh parse; the
/// per-thread contexts live as long as their thread.
mod memo {
    use melior::ir::{Attribute, AttributeLike, Type, TypeLike};
    use melior::Context;
    use mlir_sys::{MlirAttribute, MlirContext, MlirType};
    use std::cell::RefCell;
    use std::collections::HashMap;

    // Per context address, text → handle: a hit looks up by `&str` (no allocation).
    type Memo<T> = RefCell<HashMap<usize, HashMap<String, T>>>;

    thread_local! {
        static ATTRS: Memo<MlirAttribute> = RefCell::new(HashMap::new());
        static TYPES: Memo<MlirType> = RefCell::new(HashMap::new());
    }

    fn ctx_key(ctx: &Context) -> usize {
        let raw: MlirContext = ctx.to_raw();
        raw.ptr as usize
    }

    fn memo<T: Copy>(
        table: &'static std::thread::LocalKey<Memo<T>>,
        ctx: &Context,
        text: &str,
        parse: impl FnOnce() -> Option<T>,
    ) -> Option<T> {
        let k = ctx_key(ctx);
        if let Some(raw) = table.with(|m| m.borrow().get(&k).and_then(|t| t.get(text)).copied()) {
            return Some(raw);
        }
        let raw = parse()?;
        table.with(|m| {
            m.borrow_mut()
                .entry(k)
                .or_default()
                .insert(text.to_string(), raw)
        });
        Some(raw)
    }

    pub fn memo_attr<'c>(ctx: &'c Context, text: &str) -> Option<Attribute<'c>> {
        let raw = memo(&ATTRS, ctx, text, || {
            Attribute::parse(ctx, text).map(|a| a.to_raw())
        })?;
        // SAFETY: parsed in this very context (the key is its address), which is alive (`ctx`);
        // MLIR keeps uniqued attributes for the context's life.
        Some(unsafe { Attribute::from_raw(raw) })
    }

    pub fn memo_type<'c>(ctx: &'c Context, text: &str) -> Option<Type<'c>> {
        let raw = memo(&TYPES, ctx, text, || {
            Type::parse(ctx, text).map(|t| t.to_raw())
        })?;
        // SAFETY: as for attributes: parsed in this live context, uniqued for its whole life.
        Some(unsafe { Type::from_raw(raw) })
    }
}
pub(crate) use memo::{memo_attr, memo_type};
