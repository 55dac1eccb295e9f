//! Tokens -> the small model the other phases work on.
//!
//! Parsing only fails when the annotated item is not a function with a body
//! whose signature parses; a syntax error inside the body is recovered from
//! (`recover`), and everything else (signature and body rules) is validated by
//! `check`, so that all mistakes are reported together.

use proc_macro2::TokenStream as TokenStream2;
use syn::{Item, ItemFn};

use crate::recover::{recover_fn, Recovered};
use crate::syntax::{item_head, parse_whole};

/// Which attribute is being expanded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MacroKind {
    /// `#[tpu_kernel]`: a kernel entry point.
    Kernel,
    /// `#[kernel_fn]`: a helper called from kernels.
    KernelFn,
}

impl MacroKind {
    /// The attribute as the user wrote it, for messages.
    pub(crate) fn attr(self) -> &'static str {
        match self {
            MacroKind::Kernel => "#[tpu_kernel]",
            MacroKind::KernelFn => "#[kernel_fn]",
        }
    }
}

/// An annotated function, not yet validated.
pub(crate) struct Kernel {
    pub(crate) kind: MacroKind,
    /// The attribute arguments (must be empty; `check` reports them).
    pub(crate) args: TokenStream2,
    pub(crate) func: ItemFn,
    /// The body's broken statements (set aside) and their syntax errors; empty when it parsed.
    pub(crate) recovered: Recovered,
}

pub(crate) fn parse(
    kind: MacroKind,
    args: TokenStream2,
    item: TokenStream2,
) -> syn::Result<Kernel> {
    let parsed = match parse_whole::<Item>(item.clone()) {
        Ok(parsed) => parsed,
        Err(error) => {
            let (func, recovered) = recover_fn(&item, &error).ok_or(error)?;
            return Ok(Kernel {
                kind,
                args,
                func,
                recovered,
            });
        }
    };
    match parsed {
        Item::Fn(func) => Ok(Kernel {
            kind,
            args,
            func,
            recovered: Recovered::default(),
        }),
        other => Err(syn::Error::new_spanned(
            item_head(&other),
            format!(
                "{} can only be applied to a function with a body, e.g. `fn my_kernel(x: Ref<f32>, o: RefMut<f32>) {{ .. }}`",
                kind.attr()
            ),
        )),
    }
}
