//! Validation: attribute arguments, the signature, and (via `body`) the body.
//!
//! Every problem is collected, so the user sees all mistakes at once. Each
//! error is spanned at the offending tokens and says what to do instead.

use std::fmt::Display;

use quote::ToTokens;
use syn::{FnArg, Pat, ReturnType, Type};

use crate::body;
use crate::parse::{Kernel, MacroKind};

/// Message for a reference-typed `#[tpu_kernel]` parameter.
pub(crate) const MSG_REF_PARAM: &str = "kernel parameters cannot be references; pass Ref<T>/RefMut<T> handles by value, e.g. `o: RefMut<f32>`";
/// Message for a `#[tpu_kernel]` with a return type.
pub(crate) const MSG_KERNEL_RETURN: &str = "a #[tpu_kernel] function returns nothing; outputs are written through RefMut parameters with `.store(..)`";

/// All validation of an annotated function.
pub(crate) fn check(kernel: &Kernel) -> syn::Result<()> {
    let mut errors = Errors::default();
    for error in &kernel.recovered.errors {
        errors.push(error.clone());
    }
    check_args(kernel, &mut errors);
    check_signature(kernel, &mut errors);
    body::check_block(&kernel.func.block, &mut errors);
    errors.finish()
}

fn check_args(kernel: &Kernel, errors: &mut Errors) {
    if !kernel.args.is_empty() {
        errors.error(
            &kernel.args,
            format!(
                "{attr} takes no arguments; write `{attr}`",
                attr = kernel.kind.attr()
            ),
        );
    }
}

fn check_signature(kernel: &Kernel, errors: &mut Errors) {
    let sig = &kernel.func.sig;
    let what = match kernel.kind {
        MacroKind::Kernel => "a #[tpu_kernel] function",
        MacroKind::KernelFn => "a #[kernel_fn] function",
    };
    if let Some(token) = &sig.constness {
        errors.error(
            token,
            format!(
                "{what} cannot be a `const fn`; remove `const` (kernels are traced at run time)"
            ),
        );
    }
    if let Some(token) = &sig.asyncness {
        errors.error(
            token,
            format!("{what} cannot be `async`; remove `async` (tracing is synchronous)"),
        );
    }
    if let Some(token) = &sig.unsafety {
        errors.error(
            token,
            format!(
                "{what} cannot be an `unsafe fn`; remove `unsafe` (kernel handles are safe to use)"
            ),
        );
    }
    if let Some(abi) = &sig.abi {
        errors.error(
            abi,
            format!(
                "{what} cannot have an `extern` ABI; remove `{}`",
                abi.to_token_stream()
            ),
        );
    }
    if let Some(variadic) = &sig.variadic {
        errors.error(
            variadic,
            format!("{what} cannot be variadic; declare a fixed list of parameters"),
        );
    }
    if kernel.kind == MacroKind::Kernel {
        check_kernel_signature(kernel, errors);
    }
}

/// The extra rules for entry points.
fn check_kernel_signature(kernel: &Kernel, errors: &mut Errors) {
    let sig = &kernel.func.sig;
    if let ReturnType::Type(arrow, ty) = &sig.output {
        if !is_unit(ty) {
            errors.error(quote::quote!(#arrow #ty), MSG_KERNEL_RETURN);
        }
    }
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(receiver) => errors.error(
                receiver,
                "a #[tpu_kernel] function cannot take `self`; make it a free function and pass handles as parameters",
            ),
            FnArg::Typed(param) => {
                let plain = matches!(&*param.pat, Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none());
                if !plain {
                    errors.error(
                        &param.pat,
                        "a #[tpu_kernel] parameter must be a plain name, e.g. `x: Ref<f32>`",
                    );
                }
                if is_reference(&param.ty) {
                    errors.error(&param.ty, MSG_REF_PARAM);
                }
            }
        }
    }
}

fn is_unit(ty: &Type) -> bool {
    match ty {
        Type::Tuple(tuple) => tuple.elems.is_empty(),
        Type::Paren(paren) => is_unit(&paren.elem),
        Type::Group(group) => is_unit(&group.elem),
        _ => false,
    }
}

fn is_reference(ty: &Type) -> bool {
    match ty {
        Type::Reference(_) => true,
        Type::Paren(paren) => is_reference(&paren.elem),
        Type::Group(group) => is_reference(&group.elem),
        _ => false,
    }
}

/// Collects errors with [`syn::Error::combine`].
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(error),
            None => self.0 = Some(error),
        }
    }

    /// An error spanned at `tokens`.
    pub(crate) fn error(&mut self, tokens: impl ToTokens, message: impl Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    pub(crate) fn finish(self) -> syn::Result<()> {
        match self.0 {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}
