//! The rewrites: comparisons and logic operators, `if`, `for` and `while`.
//!
//! The body is rewritten in place, bottom-up; a rewritten node is replaced
//! with `Expr::Verbatim` holding the generated tokens (which already contain
//! the rewritten children). Generated runtime paths carry the span of the
//! user's operator or keyword, so type errors and `#[track_caller]` locations
//! point at the user's code; generated locals use mixed-site hygiene so they
//! can never clash with user names.
//!
//! Generation never fails. It also runs on bodies that `check` rejected (the
//! result is emitted next to the errors); then constructs that cannot be
//! rewritten (`if let`, `for x in v.iter()`, bodies containing `return`, ...)
//! are left as plain Rust, with their sub-expressions still rewritten.

use proc_macro2::{Ident, Span, TokenStream as TokenStream2};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{BinOp, Block, Expr, ExprBinary, ExprForLoop, ExprIf, ExprWhile, FnArg, Pat, Stmt, Type};

use crate::carried;
use crate::parse::Kernel;
use crate::syntax::{
    contains_escape, expr_contains_escape, is_loop_binding, range_parts, unparen, unroll_arg,
};

/// The rewritten function.
pub(crate) fn generate(kernel: Kernel) -> TokenStream2 {
    let mut func = kernel.func;
    func.sig.inputs.iter_mut().for_each(mutable_ref_param);
    Rewriter.block(&mut func.block);
    // Statements that did not parse go back as the user wrote them.
    kernel.recovered.restore(func.into_token_stream())
}

/// `o: RefMut<f32>` -> `#[allow(unused_mut)] mut o: RefMut<f32>`, so that `o += v` (Rust's `+=`,
/// which takes `&mut o`) works on a writable ref parameter as written. Only the binding changes: a
/// ref is a `Copy` handle, `o += v` stores into what it points at.
fn mutable_ref_param(input: &mut FnArg) {
    let FnArg::Typed(param) = input else {
        return;
    };
    let Pat::Ident(ident) = &mut *param.pat else {
        return;
    };
    let is_ref_mut = match &*param.ty {
        Type::Path(path) => path
            .path
            .segments
            .last()
            .is_some_and(|last| last.ident == "RefMut"),
        _ => false,
    };
    if is_ref_mut && ident.mutability.is_none() && ident.by_ref.is_none() {
        let span = ident.ident.span();
        ident.mutability = Some(syn::Token![mut](span));
        param
            .attrs
            .push(syn::parse_quote_spanned!(span=> #[allow(unused_mut)]));
    }
}

struct Rewriter;

impl Rewriter {
    fn block(&mut self, block: &mut Block) {
        for stmt in &mut block.stmts {
            self.stmt(stmt);
        }
    }

    fn stmt(&mut self, stmt: &mut Stmt) {
        match stmt {
            Stmt::Local(local) => {
                if let Some(init) = &mut local.init {
                    self.expr(&mut init.expr);
                    if let Some((_, diverge)) = &mut init.diverge {
                        self.expr(diverge);
                    }
                }
            }
            Stmt::Expr(expr, _) => self.expr(expr),
            // `const`/`use` items are compile-time Rust; macros are opaque.
            Stmt::Item(_) | Stmt::Macro(_) => {}
        }
    }

    fn expr(&mut self, expr: &mut Expr) {
        let rewritten = match &mut *expr {
            Expr::Binary(binary) => {
                self.expr(&mut binary.left);
                self.expr(&mut binary.right);
                comparison(binary).or_else(|| compound_assignment(binary))
            }
            Expr::If(if_expr) => self.if_else(if_expr),
            Expr::ForLoop(for_loop) => self.for_loop(for_loop),
            Expr::While(while_expr) => self.while_loop(while_expr),
            other => {
                self.children(other);
                None
            }
        };
        if let Some(tokens) = rewritten {
            *expr = Expr::Verbatim(tokens);
        }
    }

    /// Rewrites the sub-expressions of a node that is kept as it is (binary
    /// operators, `if`, `for` and `while` are handled by [`Self::expr`]).
    fn children(&mut self, expr: &mut Expr) {
        match expr {
            Expr::Array(e) => e.elems.iter_mut().for_each(|e| self.expr(e)),
            Expr::Assign(e) => {
                self.expr(&mut e.left);
                self.expr(&mut e.right);
            }
            Expr::Async(e) => self.block(&mut e.block),
            Expr::Await(e) => self.expr(&mut e.base),
            Expr::Block(e) => self.block(&mut e.block),
            Expr::Break(e) => self.opt(&mut e.expr),
            Expr::Call(e) => {
                self.expr(&mut e.func);
                e.args.iter_mut().for_each(|e| self.expr(e));
            }
            Expr::Cast(e) => self.expr(&mut e.expr),
            Expr::Closure(e) => self.expr(&mut e.body),
            Expr::Field(e) => self.expr(&mut e.base),
            Expr::Group(e) => self.expr(&mut e.expr),
            Expr::Index(e) => {
                self.expr(&mut e.expr);
                self.expr(&mut e.index);
            }
            Expr::Let(e) => self.expr(&mut e.expr),
            Expr::Loop(e) => self.block(&mut e.body),
            // Arms keep plain Rust semantics (guards need `bool`).
            Expr::Match(e) => {
                self.expr(&mut e.expr);
                e.arms.iter_mut().for_each(|arm| self.expr(&mut arm.body));
            }
            Expr::MethodCall(e) => {
                self.expr(&mut e.receiver);
                e.args.iter_mut().for_each(|e| self.expr(e));
            }
            Expr::Paren(e) => self.expr(&mut e.expr),
            Expr::Range(e) => {
                self.opt(&mut e.start);
                self.opt(&mut e.end);
            }
            Expr::RawAddr(e) => self.expr(&mut e.expr),
            Expr::Reference(e) => self.expr(&mut e.expr),
            // The length is a constant: only the element is rewritten.
            Expr::Repeat(e) => self.expr(&mut e.expr),
            Expr::Return(e) => self.opt(&mut e.expr),
            Expr::Struct(e) => {
                e.fields.iter_mut().for_each(|f| self.expr(&mut f.expr));
                self.opt(&mut e.rest);
            }
            Expr::Try(e) => self.expr(&mut e.expr),
            Expr::TryBlock(e) => self.block(&mut e.block),
            Expr::Tuple(e) => e.elems.iter_mut().for_each(|e| self.expr(e)),
            Expr::Unary(e) => self.expr(&mut e.expr),
            Expr::Unsafe(e) => self.block(&mut e.block),
            Expr::Yield(e) => self.opt(&mut e.expr),
            // Leaves, compile-time constants, macros and anything unknown.
            _ => {}
        }
    }

    fn opt(&mut self, expr: &mut Option<Box<Expr>>) {
        if let Some(expr) = expr {
            self.expr(expr);
        }
    }

    /// `if cond { A } else { B }` -> `P::if_else(cond, vars, |vars| .., |vars| ..)`.
    fn if_else(&mut self, if_expr: &mut ExprIf) -> Option<TokenStream2> {
        let else_escapes = match &if_expr.else_branch {
            Some((_, else_branch)) => expr_contains_escape(else_branch),
            None => false,
        };
        if has_let(&if_expr.cond) || contains_escape(&if_expr.then_branch) || else_escapes {
            self.children_of_if(if_expr);
            return None;
        }

        // Analyse the original branches, then rewrite them.
        let then_vars = carried::assigned_in_block(&if_expr.then_branch);
        let else_vars = match &if_expr.else_branch {
            Some((_, else_branch)) => carried::assigned_in_expr(else_branch),
            None => Vec::new(),
        };
        let vars = carried::union(&then_vars, &else_vars);
        self.children_of_if(if_expr);

        let span = if_expr.if_token.span;
        let p = private_path(span);
        let tk_vars = internal("__tk_vars", span);
        let tk_value = internal("__tk_value", span);
        let tuple = vars_tuple(&vars);
        let attrs = &if_expr.attrs;
        let cond = unparen(&if_expr.cond);

        let then_params = params(&vars, |v| carried::contains(&then_vars, v));
        let then_block = &if_expr.then_branch;
        let then_closure = quote_spanned! {span=>
            |#then_params| {
                let #tk_value = #then_block;
                (#tuple, #tk_value)
            }
        };
        let else_closure = match &if_expr.else_branch {
            Some((_, else_branch)) => {
                let else_params = params(&vars, |v| carried::contains(&else_vars, v));
                quote_spanned! {span=>
                    |#else_params| {
                        let #tk_value = #else_branch;
                        (#tuple, #tk_value)
                    }
                }
            }
            None => {
                let else_params = params(&vars, |_| false);
                quote_spanned!(span=> |#else_params| (#tuple, ()))
            }
        };

        Some(if vars.is_empty() {
            quote_spanned! {span=>
                #(#attrs)*
                {
                    let ((), #tk_value) = #p::if_else(#cond, (), #then_closure, #else_closure);
                    #tk_value
                }
            }
        } else {
            let write_back = write_back(span, &tuple, &tk_vars);
            quote_spanned! {span=>
                #(#attrs)*
                {
                    let (#tk_vars, #tk_value) = #p::if_else(#cond, #tuple, #then_closure, #else_closure);
                    #write_back
                    #tk_value
                }
            }
        })
    }

    fn children_of_if(&mut self, if_expr: &mut ExprIf) {
        self.expr(&mut if_expr.cond);
        self.block(&mut if_expr.then_branch);
        if let Some((_, else_branch)) = &mut if_expr.else_branch {
            self.expr(else_branch);
        }
    }

    /// `for i in lo..hi { body }` -> `P::for_range(lo, hi, vars, |i, vars| ..)`.
    fn for_loop(&mut self, for_loop: &mut ExprForLoop) -> Option<TokenStream2> {
        if unroll_arg(&for_loop.expr).is_some() {
            self.unrolled_loop(for_loop);
            return None;
        }
        let traceable = for_loop.label.is_none()
            && is_loop_binding(&for_loop.pat)
            && range_parts(&for_loop.expr).is_ok()
            && !contains_escape(&for_loop.body);
        let vars = carried::assigned_in_loop(Some(&for_loop.pat), &for_loop.body);
        self.expr(&mut for_loop.expr);
        self.block(&mut for_loop.body);
        if !traceable {
            return None;
        }
        let parts = range_parts(&for_loop.expr).ok()?;

        let span = for_loop.for_token.span;
        let p = private_path(span);
        let tk_vars = internal("__tk_vars", span);
        let tuple = vars_tuple(&vars);
        let body_params = params(&vars, |_| true);
        let body = closure_body(&for_loop.body, &vars);
        let pat = &for_loop.pat;
        let attrs = &for_loop.attrs;
        let (lo, hi) = (parts.lo, parts.hi);
        let call = match parts.step {
            None => quote_spanned! {span=>
                #p::for_range(#lo, #hi, #tuple, |#pat, #body_params| #body)
            },
            Some(step) => {
                let step = unparen(step);
                quote_spanned! {span=>
                    #p::for_range_step(#lo, #hi, #step, #tuple, |#pat, #body_params| #body)
                }
            }
        };
        Some(finish_loop(span, attrs, &vars, &tk_vars, &tuple, call))
    }

    /// `for p in unroll(lo..hi) { body }` stays a Rust `for` loop (the body traced once per `p`, outer
    /// variables assigned as in Rust) over `P::unroll_range(lo, hi)`: only the iterable is replaced,
    /// each bound a separate argument so that a traced one gets the library's message.
    fn unrolled_loop(&mut self, for_loop: &mut ExprForLoop) {
        self.expr(&mut for_loop.expr);
        self.block(&mut for_loop.body);
        let span = unparen(&for_loop.expr).span();
        let Some(Ok(parts)) = unroll_arg(&for_loop.expr).map(range_parts) else {
            return;
        };
        let p = private_path(span);
        let (lo, hi) = (parts.lo, parts.hi);
        let call = match parts.step {
            None => quote_spanned!(span=> #p::unroll_range(#lo, #hi)),
            Some(step) => {
                let step = unparen(step);
                quote_spanned!(span=> #p::unroll_range_step(#lo, #hi, #step))
            }
        };
        *for_loop.expr = Expr::Verbatim(call);
    }

    /// `while cond { body }` -> `P::while_loop(vars, |vars| cond, |vars| ..)`.
    fn while_loop(&mut self, while_expr: &mut ExprWhile) -> Option<TokenStream2> {
        let traceable = while_expr.label.is_none()
            && !has_let(&while_expr.cond)
            && !contains_escape(&while_expr.body);
        let vars = carried::assigned_in_loop(None, &while_expr.body);
        // Carried variables the condition never mentions are bound as `_`
        // (no unused-variable warnings). Any token with the same name counts
        // as a mention, so a variable the condition reads is never dropped.
        let cond_tokens = while_expr.cond.to_token_stream();
        let cond_params = params_or_wild(&vars, |v| mentions(&cond_tokens, v));
        self.expr(&mut while_expr.cond);
        self.block(&mut while_expr.body);
        if !traceable {
            return None;
        }

        let span = while_expr.while_token.span;
        let p = private_path(span);
        let tk_vars = internal("__tk_vars", span);
        let tuple = vars_tuple(&vars);
        let body_params = params(&vars, |_| true);
        let body = closure_body(&while_expr.body, &vars);
        let cond = unparen(&while_expr.cond);
        let attrs = &while_expr.attrs;
        let call = quote_spanned! {span=>
            #p::while_loop(#tuple, |#cond_params| #cond, |#body_params| #body)
        };
        Some(finish_loop(span, attrs, &vars, &tk_vars, &tuple, call))
    }
}

/// `{ let __tk_vars = call; (v1, ..,) = __tk_vars; }`, or `{ let () = call; }`
/// when nothing is carried.
fn finish_loop(
    span: Span,
    attrs: &[syn::Attribute],
    vars: &[Ident],
    tk_vars: &Ident,
    tuple: &TokenStream2,
    call: TokenStream2,
) -> TokenStream2 {
    if vars.is_empty() {
        quote_spanned! {span=>
            #(#attrs)*
            {
                let () = #call;
            }
        }
    } else {
        let write_back = write_back(span, tuple, tk_vars);
        quote_spanned! {span=>
            #(#attrs)*
            {
                let #tk_vars = #call;
                #write_back
            }
        }
    }
}

/// `(v1, ..,) = __tk_vars;`, assigning the results back to the variables.
///
/// A variable that is not read after the `if`/loop would make rustc report
/// this generated assignment as `unused_assignments` (at the user's variable
/// name), although the equivalent plain Rust is fine; the `allow` covers only
/// this generated statement.
fn write_back(span: Span, tuple: &TokenStream2, tk_vars: &Ident) -> TokenStream2 {
    quote_spanned! {span=>
        #[allow(unused_assignments)]
        {
            #tuple = #tk_vars;
        }
    }
}

/// A loop body closure: the user's block, then the carried tuple. The block
/// is kept whole so `let`s inside it cannot shadow the returned variables,
/// and (as in a Rust loop) it must have type `()`.
fn closure_body(body: &Block, vars: &[Ident]) -> TokenStream2 {
    if vars.is_empty() {
        body.to_token_stream()
    } else {
        let tuple = vars_tuple(vars);
        quote!({ #body #tuple })
    }
}

/// `a == b` etc. -> the traced comparison/logic call, spanned at the operator.
fn comparison(binary: &ExprBinary) -> Option<TokenStream2> {
    let (trait_name, method) = match binary.op {
        BinOp::Eq(_) => ("TraceEq", "trace_eq"),
        BinOp::Ne(_) => ("TraceEq", "trace_ne"),
        BinOp::Lt(_) => ("TraceOrd", "trace_lt"),
        BinOp::Le(_) => ("TraceOrd", "trace_le"),
        BinOp::Gt(_) => ("TraceOrd", "trace_gt"),
        BinOp::Ge(_) => ("TraceOrd", "trace_ge"),
        BinOp::And(_) => ("TraceLogic", "trace_and"),
        BinOp::Or(_) => ("TraceLogic", "trace_or"),
        _ => return None,
    };
    let span = binary.op.span();
    let p = private_path(span);
    let trait_name = Ident::new(trait_name, span);
    let method = Ident::new(method, span);
    let left = unparen(&binary.left);
    let right = unparen(&binary.right);
    let attrs = &binary.attrs;
    Some(quote_spanned!(span=> #(#attrs)* #p::#trait_name::#method(#left, #right)))
}

/// `w op= value` (`+= -= *= /= %=`) whose left side is not a place (a window `o.at(..)`, which Rust
/// refuses as an assignee) -> `P::TraceCompoundAssign::<P::AddOp, _>::trace_compound_assign(w, value)`,
/// the window by value.
/// A place (`acc`, `o`, `t.0`, `a[i]`) keeps Rust's own operator: values and refs implement it.
fn compound_assignment(binary: &ExprBinary) -> Option<TokenStream2> {
    let op = match binary.op {
        BinOp::AddAssign(_) => "AddOp",
        BinOp::SubAssign(_) => "SubOp",
        BinOp::MulAssign(_) => "MulOp",
        BinOp::DivAssign(_) => "DivOp",
        BinOp::RemAssign(_) => "RemOp",
        _ => return None,
    };
    if is_place(&binary.left) {
        return None;
    }
    let span = binary.op.span();
    let p = private_path(span);
    let op = Ident::new(op, span);
    let left = unparen(&binary.left);
    let right = unparen(&binary.right);
    let attrs = &binary.attrs;
    Some(quote_spanned! {span=>
        #(#attrs)* #p::TraceCompoundAssign::<#p::#op, _>::trace_compound_assign(#left, #right)
    })
}

/// Whether an expression is a place Rust can assign to (a variable, a field, an index, a deref).
fn is_place(expr: &Expr) -> bool {
    match expr {
        Expr::Path(_) | Expr::Field(_) | Expr::Index(_) => true,
        Expr::Unary(unary) => matches!(unary.op, syn::UnOp::Deref(_)),
        Expr::Paren(paren) => is_place(&paren.expr),
        Expr::Group(group) => is_place(&group.expr),
        _ => false,
    }
}

/// `::tpu_kernel::__private`, spanned at the user's token.
fn private_path(span: Span) -> TokenStream2 {
    quote_spanned!(span=> ::tpu_kernel::__private)
}

/// A generated local: invisible to user code, located at the user's token.
fn internal(name: &str, span: Span) -> Ident {
    Ident::new(name, Span::mixed_site().located_at(span))
}

/// `(v1, v2,)`, or `()`.
fn vars_tuple(vars: &[Ident]) -> TokenStream2 {
    quote!((#(#vars,)*))
}

/// `(mut v1, v2,)`: `mut` where `is_mut` says so; `()` when empty.
fn params(vars: &[Ident], is_mut: impl Fn(&Ident) -> bool) -> TokenStream2 {
    let params = vars.iter().map(|v| {
        if is_mut(v) {
            quote!(mut #v)
        } else {
            quote!(#v)
        }
    });
    quote!((#(#params,)*))
}

/// `(v1, _,)`: `_` for variables that `keep` rejects; `()` when empty.
fn params_or_wild(vars: &[Ident], keep: impl Fn(&Ident) -> bool) -> TokenStream2 {
    let params = vars.iter().map(|v| {
        if keep(v) {
            quote!(#v)
        } else {
            quote_spanned!(v.span()=> _)
        }
    });
    quote!((#(#params,)*))
}

/// Whether any identifier token in `tokens` (recursively) is `ident`.
fn mentions(tokens: &TokenStream2, ident: &Ident) -> bool {
    tokens.clone().into_iter().any(|tree| match tree {
        proc_macro2::TokenTree::Ident(i) => i == *ident,
        proc_macro2::TokenTree::Group(g) => mentions(&g.stream(), ident),
        _ => false,
    })
}

/// Whether an `if`/`while` condition is (or chains) a `let`.
fn has_let(cond: &Expr) -> bool {
    match unparen(cond) {
        Expr::Let(_) => true,
        Expr::Binary(b) if matches!(b.op, BinOp::And(_)) => has_let(&b.left) || has_let(&b.right),
        _ => false,
    }
}
