//! `#[export]` and `export_library!`: a launch function as a kernel other languages call.
//!
//! `#[export]` keeps the launch function as written (minus the `#[default(..)]` parameter attributes)
//! and adds a hidden `__tpu_kernel_export_<name>()` describing it: its array parameters (those of type
//! `ArrayType`), its static parameters with their types and defaults, its gradient rule, and a shim
//! that calls it from (arrays, JSON parameters). A parameter of type `Target` is neither: the shim
//! passes the target the kernel is built for (the request's), so the launch function can pick block
//! sizes or a formulation per TPU generation. `export_library!` lists the exports of a crate, and
//! optionally its host functions (plain Rust functions called by name, `kernel_runtime::export::host`),
//! and generates the C ABI symbols over them (see `kernel_runtime::export::abi`).
//!
//! parse → check → generate, as for `#[tpu_kernel]`; every mistake is collected and spanned.

use proc_macro2::{Group, TokenStream as TokenStream2, TokenTree};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{
    parenthesized, Attribute, Expr, FnArg, Ident, Item, ItemFn, LitStr, Pat, Path, Token, Type,
};

use crate::check::Errors;
use crate::syntax::{item_head, parse_whole, split_body, take_inner_attributes, with_empty_body};

const P: &str = "::tpu_kernel::__private::export";

fn private() -> TokenStream2 {
    P.parse().unwrap_or_default()
}

// ------------------------------------------------------------------------------------------ #[export]

/// `#[export(name = "..", fwd = k_fwd, grad(x = k(g, y, block = block), (a, b) = k2(..)))]`.
#[derive(Default)]
struct ExportArgs {
    name: Option<LitStr>,
    /// The kernel run instead of this one under differentiation: the same outputs first, then the
    /// residuals the backward kernels read (as `outN`).
    fwd: Option<Ident>,
    grad: Option<(Ident, Vec<GradEntry>)>,
    /// The array parameters whose buffers the kernel's outputs alias (`mutates(x)`).
    mutates: Vec<Ident>,
}

/// `(x, w) = rmsnorm_bwd(x, w, g, eps = eps)`.
struct GradEntry {
    inputs: Vec<Ident>,
    kernel: Ident,
    args: Vec<Ident>,
    params: Vec<(Ident, Ident)>,
}

enum GradArg {
    Array(Ident),
    Param(Ident, Ident),
}

impl Parse for GradArg {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let name: Ident = input.parse()?;
        if input.peek(Token![=]) {
            input.parse::<Token![=]>()?;
            Ok(GradArg::Param(name, input.parse()?))
        } else {
            Ok(GradArg::Array(name))
        }
    }
}

impl Parse for GradEntry {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let inputs = if input.peek(syn::token::Paren) {
            let content;
            parenthesized!(content in input);
            Punctuated::<Ident, Token![,]>::parse_terminated(&content)?
                .into_iter()
                .collect()
        } else {
            vec![input.parse()?]
        };
        input.parse::<Token![=]>()?;
        let kernel: Ident = input.parse()?;
        let content;
        parenthesized!(content in input);
        let (mut args, mut params) = (Vec::new(), Vec::new());
        for a in Punctuated::<GradArg, Token![,]>::parse_terminated(&content)? {
            match a {
                GradArg::Array(a) => args.push(a),
                GradArg::Param(b, f) => params.push((b, f)),
            }
        }
        Ok(GradEntry {
            inputs,
            kernel,
            args,
            params,
        })
    }
}

impl Parse for ExportArgs {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut out = ExportArgs::default();
        while !input.is_empty() {
            let key: Ident = input.parse()?;
            if key == "name" {
                input.parse::<Token![=]>()?;
                out.name = Some(input.parse()?);
            } else if key == "fwd" {
                input.parse::<Token![=]>()?;
                out.fwd = Some(input.parse()?);
            } else if key == "mutates" {
                let content;
                parenthesized!(content in input);
                out.mutates = Punctuated::<Ident, Token![,]>::parse_terminated(&content)?
                    .into_iter()
                    .collect();
            } else if key == "grad" {
                let content;
                parenthesized!(content in input);
                let entries = Punctuated::<GradEntry, Token![,]>::parse_terminated(&content)?;
                out.grad = Some((key, entries.into_iter().collect()));
            } else {
                return Err(syn::Error::new_spanned(
                    key,
                    "#[export] takes `name = \"...\"`, `fwd = forward_kernel_with_residuals`, `grad(input = backward_kernel(args..), ..)` and `mutates(input, ..)`",
                ));
            }
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
        }
        Ok(out)
    }
}

/// What a launch-function parameter is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ParamKind {
    /// An `ArrayType`: one array of the call.
    Array,
    /// A `Target`: the generation the request builds for.
    Target,
    /// Anything else: a static parameter (JSON), by keyword in Python.
    Static,
}

/// One parameter of the launch function.
struct Param {
    name: Ident,
    ty: Type,
    kind: ParamKind,
    default: Option<Expr>,
}

impl Param {
    fn is_array(&self) -> bool {
        self.kind == ParamKind::Array
    }
    fn is_static(&self) -> bool {
        self.kind == ParamKind::Static
    }
}

/// The Python keyword that picks the TPU generation of a call (`lib.k(x, target="v6e")`): no static
/// parameter may take the name.
const TARGET_KEYWORD: &str = "target";

const MSG_NOT_A_LAUNCH_FN: &str = "#[export] goes on a launch function: `fn name(x: ArrayType, .., block: (usize, usize)) -> Result<PallasCall, KernelError>`";

pub(crate) fn export(attr: TokenStream2, item: TokenStream2) -> TokenStream2 {
    let (mut func, body) = match launch_fn(&item) {
        Ok(parsed) => parsed,
        Err(error) => {
            let mut out = error.into_compile_error();
            out.extend(item);
            return out;
        }
    };
    let mut errors = Errors::default();
    let args = match parse_whole::<ExportArgs>(attr) {
        Ok(a) => a,
        Err(e) => {
            errors.push(e);
            ExportArgs::default()
        }
    };
    let params = collect_params(&mut func, &mut errors);
    check_signature(&func, &mut errors);
    if let Some((_, entries)) = &args.grad {
        check_grad(
            entries,
            &params,
            &args.grad.as_ref().map(|g| g.0.clone()),
            &mut errors,
        );
    }
    for m in &args.mutates {
        let arrays: Vec<String> = params
            .iter()
            .filter(|p| p.is_array())
            .map(|p| p.name.to_string())
            .collect();
        if !arrays.contains(&m.to_string()) {
            errors.error(
                m,
                format!(
                    "`{m}` is not an array parameter of this kernel; `mutates(..)` names the inputs its outputs alias: {}",
                    arrays.join(", ")
                ),
            );
        }
    }
    if let (Some(fwd), None) = (&args.fwd, &args.grad) {
        errors.error(
            fwd,
            "`fwd` names the kernel run under differentiation to save residuals for the backward kernels; \
             it needs `grad(..)` too",
        );
    }
    // On error: the messages and the user's fn (so names resolve), but no descriptor, whose shim
    // would only add follow-up errors about the parameters already reported.
    let (mut out, generated) = match errors.finish() {
        Ok(()) => (TokenStream2::new(), generate_export(&func, &args, &params)),
        Err(e) => (e.into_compile_error(), TokenStream2::new()),
    };
    out.extend(with_body(func, body));
    out.extend(generated);
    out
}

/// The launch function with an empty body, and its body. Only the signature is the macro's
/// business: the body is plain Rust, emitted as written for rustc to read (and judge).
fn launch_fn(item: &TokenStream2) -> syn::Result<(ItemFn, Group)> {
    let not_a_fn = |other: &Item| syn::Error::new_spanned(item_head(other), MSG_NOT_A_LAUNCH_FN);
    let Some((head, body)) = split_body(item) else {
        let item = parse_whole::<Item>(item.clone())?;
        return Err(not_a_fn(&item));
    };
    match parse_whole::<Item>(with_empty_body(&head, &body))? {
        Item::Fn(mut func) => {
            // `#![doc = ..]` inside the body documents the fn too.
            let mut inner: Vec<TokenTree> = body.stream().into_iter().collect();
            func.attrs.extend(take_inner_attributes(&mut inner));
            Ok((func, body))
        }
        other => Err(not_a_fn(&other)),
    }
}

/// `func` (parsed with an empty body) with its own body back.
fn with_body(func: ItemFn, body: Group) -> TokenStream2 {
    let mut trees: Vec<TokenTree> = func.into_token_stream().into_iter().collect();
    // The printed empty block (with any inner attributes, which the body still has).
    trees.pop();
    trees.push(TokenTree::Group(body));
    trees.into_iter().collect()
}

fn is_named(ty: &Type, name: &str) -> bool {
    matches!(ty, Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == name))
}

fn is_array_type(ty: &Type) -> bool {
    let ty = match ty {
        Type::Reference(r) => &*r.elem,
        t => t,
    };
    is_named(ty, "ArrayType")
}

/// The parameters, with `#[default(..)]` taken off (they are not Rust attributes).
fn collect_params(func: &mut ItemFn, errors: &mut Errors) -> Vec<Param> {
    let mut params = Vec::new();
    for arg in func.sig.inputs.iter_mut() {
        let FnArg::Typed(pt) = arg else {
            errors.error(
                &*arg,
                "an exported launch function is a free function: no `self`",
            );
            continue;
        };
        let mut default = None;
        let mut kept: Vec<Attribute> = Vec::new();
        for a in pt.attrs.drain(..) {
            if a.path().is_ident("default") {
                match a.parse_args::<Expr>() {
                    Ok(e) => default = Some(e),
                    Err(e) => errors.push(e),
                }
            } else {
                kept.push(a);
            }
        }
        pt.attrs = kept;
        let name = match &*pt.pat {
            Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => p.ident.clone(),
            other => {
                errors.error(
                    other,
                    "exported parameters need plain names (Python passes them by name): write `block: (usize, usize)` and destructure inside",
                );
                continue;
            }
        };
        let kind = if is_array_type(&pt.ty) {
            ParamKind::Array
        } else if is_named(&pt.ty, "Target") {
            ParamKind::Target
        } else {
            ParamKind::Static
        };
        match (kind, &default) {
            (ParamKind::Array, Some(d)) => errors.error(
                d,
                "array parameters have no default; `#[default(..)]` is for static parameters",
            ),
            (ParamKind::Target, Some(d)) => errors.error(
                d,
                "the target has no default: it is the one the kernel is built for (the request's, \
                 from the JAX op's device or `target=`; `Target::DEFAULT` when none is named)",
            ),
            _ => {}
        }
        if kind == ParamKind::Target && params.iter().any(|p: &Param| p.kind == ParamKind::Target) {
            errors.error(&pt.ty, "a launch function takes the target once");
        }
        if let Type::Reference(r) = &*pt.ty {
            if is_named(&r.elem, "Target") {
                errors.error(
                    &pt.ty,
                    "take the target by value (`target: Target`; it is `Copy`)",
                );
            }
        }
        if kind == ParamKind::Static && name == TARGET_KEYWORD {
            errors.error(
                &name,
                "`target` is the JAX op's keyword for the TPU generation (`lib.kernel(x, target=\"v6e\")`): \
                 name this static parameter otherwise, or give it the type `Target` to receive the generation",
            );
        }
        params.push(Param {
            name,
            ty: (*pt.ty).clone(),
            kind,
            default,
        });
    }
    params
}

fn check_signature(func: &ItemFn, errors: &mut Errors) {
    let sig = &func.sig;
    if !sig.generics.params.is_empty() {
        errors.error(
            &sig.generics,
            "an exported launch function cannot be generic: Python picks no type parameters; take dtypes from the `ArrayType`s",
        );
    }
    if let Some(a) = &sig.asyncness {
        errors.error(a, "an exported launch function cannot be async");
    }
    if matches!(sig.output, syn::ReturnType::Default) {
        errors.error(
            &sig.ident,
            "an exported launch function returns `Result<PallasCall, KernelError>` (what `.build()` gives)",
        );
    }
}

fn check_grad(
    entries: &[GradEntry],
    params: &[Param],
    grad_kw: &Option<Ident>,
    errors: &mut Errors,
) {
    let arrays: Vec<String> = params
        .iter()
        .filter(|p| p.is_array())
        .map(|p| p.name.to_string())
        .collect();
    let statics: Vec<String> = params
        .iter()
        .filter(|p| p.is_static())
        .map(|p| p.name.to_string())
        .collect();
    let mut covered: Vec<String> = Vec::new();
    let is_special = |s: &str, base: &str| {
        s == base
            || (s.len() > base.len()
                && s.starts_with(base)
                && s[base.len()..].chars().all(|c| c.is_ascii_digit()))
    };
    for e in entries {
        for i in &e.inputs {
            let s = i.to_string();
            if !arrays.contains(&s) {
                errors.error(
                    i,
                    format!(
                        "`{s}` is not an array parameter of this kernel; gradients are for: {}",
                        arrays.join(", ")
                    ),
                );
            } else if covered.contains(&s) {
                errors.error(i, format!("the gradient of `{s}` is given twice"));
            } else {
                covered.push(s);
            }
        }
        for a in &e.args {
            let s = a.to_string();
            if !arrays.contains(&s) && !is_special(&s, "g") && !is_special(&s, "out") {
                errors.error(
                    a,
                    format!("unknown array `{s}`: backward kernels take the forward arrays ({}), `out`/`out0`.. (outputs) and `g`/`g0`.. (their cotangents)", arrays.join(", ")),
                );
            }
        }
        for (_, f) in &e.params {
            if !statics.contains(&f.to_string()) {
                errors.error(f, format!("`{f}` is not a static parameter of this kernel"));
            }
        }
    }
    if let Some(kw) = grad_kw {
        let missing: Vec<&String> = arrays.iter().filter(|a| !covered.contains(a)).collect();
        if !missing.is_empty() {
            errors.error(
                kw,
                format!(
                    "grad(..) must give the gradient of every array parameter; missing: {}",
                    missing
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        }
    }
}

fn doc_of(attrs: &[Attribute]) -> String {
    let lines: Vec<String> = attrs
        .iter()
        .filter(|a| a.path().is_ident("doc"))
        .filter_map(|a| match &a.meta {
            syn::Meta::NameValue(nv) => match &nv.value {
                Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => Some(s.value()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    lines
        .iter()
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
        .trim()
        .to_string()
}

fn generate_export(func: &ItemFn, args: &ExportArgs, params: &[Param]) -> TokenStream2 {
    let p = private();
    let fn_name = &func.sig.ident;
    let vis = &func.vis;
    let export_fn = format_ident!("__tpu_kernel_export_{}", fn_name);
    let name = args
        .name
        .as_ref()
        .map(|n| n.value())
        .unwrap_or_else(|| fn_name.to_string());
    let doc = doc_of(&func.attrs);
    let inputs: Vec<String> = params
        .iter()
        .filter(|x| x.is_array())
        .map(|x| x.name.to_string())
        .collect();
    let mut array_no = 0usize;
    let mut call_args = Vec::new();
    let mut reads = Vec::new();
    for x in params {
        let n = &x.name;
        if x.is_array() {
            let i = array_no;
            array_no += 1;
            call_args.push(match &x.ty {
                Type::Reference(_) => quote!(&__tpu_kernel_arrays[#i]),
                _ => quote!(::core::clone::Clone::clone(&__tpu_kernel_arrays[#i])),
            });
        } else if x.kind == ParamKind::Target {
            // The library builds inside the request's `Target::scope`: the target in scope is the
            // request's.
            let ty = &x.ty;
            reads.push(quote_spanned!(ty.span()=> let #n: #ty = ::tpu_kernel::Target::current();));
            call_args.push(quote!(#n));
        } else {
            let ty = &x.ty;
            let key = n.to_string();
            reads.push(
                quote_spanned!(n.span()=> let #n: #ty = __tpu_kernel_params.get::<#ty>(#key)?;),
            );
            call_args.push(quote!(#n));
        }
    }
    let specs = params.iter().filter(|x| x.is_static()).map(|x| {
        let ty = &x.ty;
        let key = x.name.to_string();
        match &x.default {
            Some(d) => quote_spanned!(d.span()=> #p::ParamSpec::new::<#ty>(#key, ::core::option::Option::Some(#d))),
            None => quote!(#p::ParamSpec::new::<#ty>(#key, ::core::option::Option::None)),
        }
    });
    let grad = match &args.grad {
        None => quote!(::core::option::Option::None),
        Some((_, entries)) => {
            let es = entries.iter().map(|e| {
                let ins = e.inputs.iter().map(|i| i.to_string());
                let kernel = e.kernel.to_string();
                let a = e.args.iter().map(|i| i.to_string());
                let ps = e.params.iter().map(|(b, f)| {
                    let (b, f) = (b.to_string(), f.to_string());
                    quote!((#b, #f))
                });
                quote!(#p::GradSpec { inputs: &[#(#ins),*], kernel: #kernel, args: &[#(#a),*], params: &[#(#ps),*] })
            });
            quote!(::core::option::Option::Some(::std::vec![#(#es),*]))
        }
    };
    let fwd = match &args.fwd {
        None => quote!(::core::option::Option::None),
        Some(f) => {
            let f = f.to_string();
            quote!(::core::option::Option::Some(#f))
        }
    };
    let mutates = args.mutates.iter().map(|m| m.to_string());
    let n_arrays = inputs.len();
    let here = quote_spanned!(fn_name.span()=> ::tpu_kernel::SourceLoc { file: ::core::file!(), line: ::core::line!(), col: ::core::column!() });
    quote! {
        // A type named like the launch fn (types and fns live in different namespaces), so that
        // `export_library!` reaches the export through any path the fn is reachable by — `use`d
        // names included (`use kernels::rmsnorm;` imports both).
        #[doc(hidden)]
        #[allow(non_camel_case_types, dead_code)]
        #vis struct #fn_name {}
        impl #p::ExportedKernel for #fn_name {
            fn export() -> #p::KernelExport {
                #export_fn()
            }
        }
        #[doc(hidden)]
        #[allow(non_snake_case)]
        #vis fn #export_fn() -> #p::KernelExport {
            // Names the user's parameters cannot shadow (a static parameter may be called `params`).
            fn __tpu_kernel_launch(
                __tpu_kernel_arrays: &[::tpu_kernel::ArrayType],
                __tpu_kernel_params: &#p::Params,
            ) -> ::core::result::Result<::tpu_kernel::PallasCall, ::tpu_kernel::KernelError> {
                if __tpu_kernel_arrays.len() != #n_arrays {
                    return ::core::result::Result::Err(#p::arity_error(#name, #n_arrays, __tpu_kernel_arrays.len()));
                }
                #(#reads)*
                #fn_name(#(#call_args),*)
            }
            #p::KernelExport {
                name: #name,
                doc: #doc,
                location: #here,
                inputs: &[#(#inputs),*],
                params: ::std::vec![#(#specs),*],
                fwd: #fwd,
                grad: #grad,
                mutates: &[#(#mutates),*],
                launch: __tpu_kernel_launch,
            }
        }
    }
}

// ------------------------------------------------------------------------------------ export_library!

/// `export_library!("examples", [add::add, matmul::matmul, ..], host = [grouped_matmul::group_metadata])`.
struct LibraryArgs {
    name: LitStr,
    kernels: Vec<Path>,
    /// Host functions, each exported under its Rust name.
    host: Vec<Path>,
    /// Whether the library declares tpu-kernel's allocator as its `#[global_allocator]` (the default;
    /// `allocator = system` leaves the crate's global allocator to the crate).
    own_allocator: bool,
}

const LIBRARY_USAGE: &str = "`export_library!(\"my_kernels\", [module::kernel_a, kernel_b], host = [module::helper], allocator = system)` (`host` and `allocator` optional)";

fn paths(input: ParseStream) -> syn::Result<Vec<Path>> {
    let content;
    syn::bracketed!(content in input);
    Ok(Punctuated::<Path, Token![,]>::parse_terminated(&content)?
        .into_iter()
        .collect())
}

impl Parse for LibraryArgs {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let name: LitStr = input.parse()?;
        input.parse::<Token![,]>()?;
        let kernels = paths(input)?;
        let mut host = None;
        let mut allocator: Option<Ident> = None;
        while !input.is_empty() {
            input.parse::<Token![,]>()?;
            if input.is_empty() {
                break;
            }
            let key: Ident = input.parse()?;
            let seen = match key.to_string().as_str() {
                "host" => host.is_some(),
                "allocator" => allocator.is_some(),
                _ => {
                    return Err(syn::Error::new_spanned(
                        &key,
                        format!(
                            "unknown argument `{key}`: after the kernels, only `host = [..]` (host functions) \
                             and `allocator = mimalloc | system` (the library's global allocator)"
                        ),
                    ))
                }
            };
            if seen {
                return Err(syn::Error::new_spanned(
                    &key,
                    format!("`{key}` is given twice"),
                ));
            }
            input.parse::<Token![=]>()?;
            if key == "host" {
                host = Some(paths(input)?);
            } else {
                let value: Ident = input.parse()?;
                if value != "mimalloc" && value != "system" {
                    return Err(syn::Error::new_spanned(
                        &value,
                        format!(
                            "unknown allocator `{value}`: `mimalloc` (the default: the library's own heap) \
                             or `system` (declare none: the crate's own `#[global_allocator]`, else the \
                             process's `malloc`)"
                        ),
                    ));
                }
                allocator = Some(value);
            }
        }
        Ok(LibraryArgs {
            name,
            kernels,
            host: host.unwrap_or_default(),
            own_allocator: allocator.is_none_or(|a| a == "mimalloc"),
        })
    }
}

pub(crate) fn export_library(input: TokenStream2) -> TokenStream2 {
    let args = match parse_whole::<LibraryArgs>(input) {
        Ok(a) => a,
        Err(e) => {
            let mut e2 = syn::Error::new(e.span(), format!("{e}; usage: {LIBRARY_USAGE}"));
            e2.combine(e);
            return e2.into_compile_error();
        }
    };
    let name = args.name.value();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return syn::Error::new_spanned(&args.name, "a library name is letters, digits and `_` (it names the XLA FFI target `tpu_kernel_<name>`)").into_compile_error();
    }
    let p = private();
    // Through the type `#[export]` puts beside the launch fn, by the path given: a `use`d name works.
    let exports = args
        .kernels
        .iter()
        .map(|path| quote_spanned!(path.span()=> <#path as #p::ExportedKernel>::export()));
    let host = args.host.iter().map(|path| {
        let name = path
            .segments
            .last()
            .map(|s| s.ident.to_string())
            .unwrap_or_default();
        quote_spanned!(path.span()=> #p::HostExport::new(#name, #path))
    });
    let lit = &args.name;
    // The library's own heap (kernel_runtime::export::KernelAllocator says why), spanned at the
    // library's name so a crate that declares its own allocator is pointed at this call.
    let allocator = args.own_allocator.then(|| {
        quote_spanned! {lit.span()=>
            #[global_allocator]
            static __TPU_KERNEL_ALLOCATOR: #p::KernelAllocator = #p::KernelAllocator;
        }
    });
    quote! {
        #allocator

        #[doc(hidden)]
        fn __tpu_kernel_library() -> &'static #p::Library {
            static LIBRARY: ::std::sync::OnceLock<#p::Library> = ::std::sync::OnceLock::new();
            LIBRARY.get_or_init(|| {
                #p::Library::new(#lit, ::std::vec![#(#exports),*]).with_host(::std::vec![#(#host),*])
            })
        }

        /// The C ABI version of this library (see `tpu_kernel::export`).
        #[no_mangle]
        pub extern "C" fn tpu_kernel_abi_version() -> u32 {
            #p::ABI_VERSION
        }

        /// The library description (JSON), owned by the library.
        #[no_mangle]
        pub extern "C" fn tpu_kernel_library_json() -> *const ::std::ffi::c_char {
            #p::abi::library_json(__tpu_kernel_library)
        }

        /// Answer a method call (JSON); free the answer with `tpu_kernel_free`.
        ///
        /// # Safety
        /// `method` and `request` are null or NUL-terminated strings.
        #[no_mangle]
        pub unsafe extern "C" fn tpu_kernel_call(
            method: *const ::std::ffi::c_char,
            request: *const ::std::ffi::c_char,
        ) -> *mut ::std::ffi::c_char {
            // SAFETY: forwarded to the caller.
            unsafe { #p::abi::call(__tpu_kernel_library, method, request) }
        }

        /// Free an answer of `tpu_kernel_call`.
        ///
        /// # Safety
        /// `s` is null or an unfreed answer of `tpu_kernel_call`.
        #[no_mangle]
        pub unsafe extern "C" fn tpu_kernel_free(s: *mut ::std::ffi::c_char) {
            // SAFETY: forwarded to the caller.
            unsafe { #p::abi::free(s) }
        }

        /// The XLA FFI handler (CPU) running this library's kernels.
        ///
        /// # Safety
        /// Called by XLA with a valid call frame.
        #[no_mangle]
        pub unsafe extern "C" fn tpu_kernel_ffi(frame: *mut ::std::ffi::c_void) -> *mut ::std::ffi::c_void {
            // SAFETY: forwarded to the caller.
            unsafe { #p::ffi::handle(__tpu_kernel_library(), frame as *mut #p::ffi::CallFrame) }
        }
    }
}
