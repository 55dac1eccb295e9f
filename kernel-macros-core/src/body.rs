//! Body rules: walks a kernel body and reports everything that cannot be
//! traced. Nothing is rewritten here (that is `generate`).
//!
//! The walk is an explicit match over every expression kind so that anything
//! not handled (including syntax added to syn later) is rejected rather than
//! silently passed through.

use quote::quote;
use syn::{Block, Expr, ExprClosure, Item, Label, Local, Pat, Stmt};

use crate::carried::is_compound_assignment;
use crate::check::Errors;
use crate::syntax::{is_loop_binding, item_head, range_parts, unparen, unroll_arg};

pub(crate) const MSG_CLOSURE: &str =
    "closures cannot be traced inside a kernel; write a #[kernel_fn] helper function instead";
pub(crate) const MSG_RETURN: &str =
    "`return` cannot be traced; make the value the last expression of the function";
pub(crate) const MSG_REFERENCE: &str = "references cannot be traced; kernel values (Array, Scalar, Ref) are Copy handles—pass them by value";
pub(crate) const MSG_MATCH: &str = "`match` cannot be traced; use `if`/`else` (lowered to scf.if)";
pub(crate) const MSG_LOOP: &str = "`loop` cannot be traced; use `while cond { .. }`";
pub(crate) const MSG_BREAK: &str =
    "`break` cannot be traced (scf.for has no early exit); restructure with a `while` condition";
pub(crate) const MSG_CONTINUE: &str = "`continue` cannot be traced (traced loops have no early exit); guard the rest of the loop body with `if` instead";
pub(crate) const MSG_LABEL: &str =
    "labels cannot be traced (scf.for/scf.while have no early exit); remove the label";
pub(crate) const MSG_IF_LET: &str =
    "`if let` cannot be traced; use a traced condition, e.g. `if x == 0 { .. }`";
pub(crate) const MSG_WHILE_LET: &str =
    "`while let` cannot be traced; use a traced condition, e.g. `while i < n { .. }`";
pub(crate) const MSG_LET_EXPR: &str =
    "`let` expressions cannot be traced; use a `let` statement and a traced condition";
pub(crate) const MSG_ASYNC: &str =
    "`async` blocks cannot be traced inside a kernel; kernels are traced synchronously";
pub(crate) const MSG_AWAIT: &str =
    "`.await` cannot be traced inside a kernel; compute the value before calling the kernel";
pub(crate) const MSG_UNSAFE: &str =
    "`unsafe` blocks cannot be traced inside a kernel; kernel handles are safe to use as they are";
pub(crate) const MSG_TRY: &str = "the `?` operator cannot be traced (a kernel has no early exit); handle the error before calling the kernel";
pub(crate) const MSG_TRY_BLOCK: &str =
    "`try` blocks cannot be traced inside a kernel; handle errors before calling the kernel";
pub(crate) const MSG_YIELD: &str =
    "`yield` cannot be traced inside a kernel; return values through RefMut outputs";
pub(crate) const MSG_MACRO: &str = "macros cannot be traced inside a kernel; write the computation with kernel functions, or move compile-time logic out of the kernel";
pub(crate) const MSG_LET_NO_INIT: &str =
    "a kernel `let` needs a value; initialize the variable where it is declared, e.g. `let mut acc = zeros();`";
pub(crate) const MSG_LET_ELSE: &str =
    "`let .. else` cannot be traced; bind the value with a plain `let` and branch with `if`";
pub(crate) const MSG_LET_PATTERN: &str =
    "this pattern cannot be traced; bind a name (`x` or `mut x`), `_`, or a tuple of those, e.g. `let (a, b) = ..`";
pub(crate) const MSG_REF_BINDING: &str =
    "`ref` bindings cannot be traced; bind by value (kernel values are Copy handles)";
pub(crate) const MSG_ITEM: &str = "items cannot be defined inside a kernel (only `use` and `const` are allowed); move this definition out of the function";
pub(crate) const MSG_STRUCT: &str = "struct literals cannot be traced in a kernel; pass kernel values as separate variables or a tuple";
pub(crate) const MSG_RANGE: &str = "a range can only be the iterable of a traced `for` loop or an argument, e.g. `for i in 0..n` or `x.at((ds(i, 8), ..))`";
pub(crate) const MSG_FOR_PATTERN: &str =
    "a traced `for` loop binds its index to a name or `_`, e.g. `for i in 0..n`";
pub(crate) const MSG_UNSUPPORTED: &str = "this expression cannot be traced in a kernel; use kernel operations (arithmetic, comparisons, method calls, `if`/`for`/`while`)";

/// Checks a function body, pushing every problem into `errors`.
pub(crate) fn check_block(block: &Block, errors: &mut Errors) {
    Checker { errors }.block(block);
}

struct Checker<'a> {
    errors: &'a mut Errors,
}

/// Where an expression appears, for the few rules that depend on it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Position {
    /// An ordinary value.
    Value,
    /// A call, method or tuple argument, or an index: ranges are allowed.
    Arg,
}

impl Checker<'_> {
    fn block(&mut self, block: &Block) {
        for stmt in &block.stmts {
            self.stmt(stmt);
        }
    }

    fn stmt(&mut self, stmt: &Stmt) {
        match stmt {
            Stmt::Local(local) => self.local(local),
            Stmt::Item(item) => self.item(item),
            // An empty statement (`a;;`), which syn keeps as nothing followed by its `;`.
            Stmt::Expr(Expr::Verbatim(tokens), Some(_)) if tokens.is_empty() => {}
            Stmt::Expr(expr, _) => self.expr(expr, Position::Value),
            Stmt::Macro(mac) => {
                let path = &mac.mac.path;
                let bang = &mac.mac.bang_token;
                self.errors.error(quote!(#path #bang), MSG_MACRO);
            }
        }
    }

    fn local(&mut self, local: &Local) {
        // With `else`, the (refutable) pattern is part of the same mistake.
        let has_else = matches!(&local.init, Some(init) if init.diverge.is_some());
        if !has_else {
            self.let_pattern(&local.pat);
        }
        match &local.init {
            None => self.errors.error(local, MSG_LET_NO_INIT),
            Some(init) => {
                self.expr(&init.expr, Position::Value);
                if let Some((else_token, diverge)) = &init.diverge {
                    self.errors
                        .error(quote!(#else_token #diverge), MSG_LET_ELSE);
                }
            }
        }
    }

    fn let_pattern(&mut self, pat: &Pat) {
        match pat {
            Pat::Ident(ident) => {
                if let Some(by_ref) = &ident.by_ref {
                    self.errors.error(by_ref, MSG_REF_BINDING);
                }
                if ident.subpat.is_some() {
                    self.errors.error(pat, MSG_LET_PATTERN);
                }
            }
            Pat::Wild(_) => {}
            Pat::Tuple(tuple) => tuple.elems.iter().for_each(|p| self.let_pattern(p)),
            Pat::Paren(paren) => self.let_pattern(&paren.pat),
            Pat::Type(typed) => self.let_pattern(&typed.pat),
            other => self.errors.error(other, MSG_LET_PATTERN),
        }
    }

    fn item(&mut self, item: &Item) {
        match item {
            // Compile-time Rust: neither traced nor rewritten.
            Item::Const(_) | Item::Use(_) => {}
            other => self.errors.error(item_head(other), MSG_ITEM),
        }
    }

    fn label(&mut self, label: &Option<Label>) {
        if let Some(label) = label {
            self.errors.error(label, MSG_LABEL);
        }
    }

    fn args<'e>(&mut self, args: impl IntoIterator<Item = &'e Expr>) {
        for arg in args {
            self.expr(arg, Position::Arg);
        }
    }

    fn expr(&mut self, expr: &Expr, position: Position) {
        match expr {
            Expr::Lit(_) | Expr::Path(_) => {}
            // Compile-time Rust, evaluated by rustc.
            Expr::Const(_) => {}
            Expr::Array(array) => self.args(&array.elems),
            Expr::Repeat(repeat) => self.expr(&repeat.expr, Position::Value),
            Expr::Tuple(tuple) => self.args(&tuple.elems),
            Expr::Paren(paren) => self.expr(&paren.expr, position),
            Expr::Group(group) => self.expr(&group.expr, position),
            Expr::Block(block) => {
                self.label(&block.label);
                self.block(&block.block);
            }
            Expr::Call(call) => {
                self.expr(&call.func, Position::Value);
                self.args(&call.args);
            }
            Expr::MethodCall(call) => {
                self.expr(&call.receiver, Position::Value);
                // No list of methods here: a method the API lacks is rustc's E0599 at the user's
                // token, with rustc's own "a method with a similar name" hint.
                self.args(&call.args);
            }
            Expr::Field(field) => self.expr(&field.base, Position::Value),
            Expr::Index(index) => {
                self.expr(&index.expr, Position::Value);
                self.expr(&index.index, Position::Arg);
            }
            Expr::Cast(cast) => self.expr(&cast.expr, Position::Value),
            Expr::Unary(unary) => self.expr(&unary.expr, Position::Value),
            Expr::Binary(binary) => {
                if is_compound_assignment(&binary.op) {
                    self.assignee(&binary.left);
                } else {
                    self.expr(&binary.left, Position::Value);
                }
                self.expr(&binary.right, Position::Value);
            }
            Expr::Assign(assign) => {
                self.assignee(&assign.left);
                self.expr(&assign.right, Position::Value);
            }
            Expr::Range(range) => {
                if position != Position::Arg {
                    self.errors.error(range, MSG_RANGE);
                }
                if let Some(start) = &range.start {
                    self.expr(start, Position::Value);
                }
                if let Some(end) = &range.end {
                    self.expr(end, Position::Value);
                }
            }
            Expr::If(if_expr) => {
                self.condition(&if_expr.cond, MSG_IF_LET);
                self.block(&if_expr.then_branch);
                if let Some((_, else_branch)) = &if_expr.else_branch {
                    self.expr(else_branch, Position::Value);
                }
            }
            Expr::While(while_expr) => {
                self.label(&while_expr.label);
                self.condition(&while_expr.cond, MSG_WHILE_LET);
                self.block(&while_expr.body);
            }
            Expr::ForLoop(for_loop) => {
                self.label(&for_loop.label);
                // `for p in unroll(lo..hi)`: the same range rules, the loop stays Rust. `unroll` of any
                // other iterable (`unroll(&copies)`, `unroll(copies.iter())`) is a Rust loop over a
                // value known when the kernel is traced: its iterable is plain Rust, not checked.
                let range = unroll_arg(&for_loop.expr).unwrap_or(&for_loop.expr);
                let range_like = match unparen(range) {
                    Expr::Range(_) => true,
                    Expr::MethodCall(call) => call.method == "step_by",
                    _ => false,
                };
                let plain_rust = unroll_arg(&for_loop.expr).is_some() && !range_like;
                if !plain_rust && !is_loop_binding(&for_loop.pat) {
                    self.errors.error(&for_loop.pat, MSG_FOR_PATTERN);
                }
                match range_parts(range) {
                    _ if plain_rust => {}
                    Ok(parts) => {
                        self.expr(parts.lo, Position::Value);
                        self.expr(parts.hi, Position::Value);
                        if let Some(step) = parts.step {
                            self.expr(step, Position::Value);
                        }
                    }
                    Err(error) => self.errors.push(error),
                }
                self.block(&for_loop.body);
            }
            Expr::Closure(closure) => self.errors.error(closure_head(closure), MSG_CLOSURE),
            Expr::Return(ret) => self.errors.error(ret, MSG_RETURN),
            Expr::Reference(reference) => {
                self.errors.error(reference, MSG_REFERENCE);
            }
            Expr::RawAddr(raw) => self.errors.error(raw, MSG_REFERENCE),
            Expr::Match(m) => {
                let match_token = &m.match_token;
                let scrutinee = &m.expr;
                self.errors
                    .error(quote!(#match_token #scrutinee), MSG_MATCH);
            }
            Expr::Loop(l) => {
                let (label, loop_token) = (&l.label, &l.loop_token);
                self.errors.error(quote!(#label #loop_token), MSG_LOOP);
            }
            Expr::Break(b) => self.errors.error(b, MSG_BREAK),
            Expr::Continue(c) => self.errors.error(c, MSG_CONTINUE),
            Expr::Async(a) => {
                let (async_token, capture) = (&a.async_token, &a.capture);
                self.errors.error(quote!(#async_token #capture), MSG_ASYNC);
            }
            Expr::Await(a) => {
                let (dot, await_token) = (&a.dot_token, &a.await_token);
                self.errors.error(quote!(#dot #await_token), MSG_AWAIT);
            }
            Expr::Unsafe(u) => self.errors.error(u.unsafe_token, MSG_UNSAFE),
            Expr::Try(t) => self.errors.error(t.question_token, MSG_TRY),
            Expr::TryBlock(t) => self.errors.error(t.try_token, MSG_TRY_BLOCK),
            Expr::Yield(y) => self.errors.error(y, MSG_YIELD),
            // `vec![..]` builds a Rust `Vec` at trace time (of copy descriptors, say): allowed.
            Expr::Macro(m) if m.mac.path.is_ident("vec") => {}
            Expr::Macro(m) => {
                let (path, bang) = (&m.mac.path, &m.mac.bang_token);
                self.errors.error(quote!(#path #bang), MSG_MACRO);
            }
            Expr::Struct(s) => self.errors.error(&s.path, MSG_STRUCT),
            Expr::Let(l) => self.errors.error(l, MSG_LET_EXPR),
            other => self.errors.error(other, MSG_UNSUPPORTED),
        }
    }

    /// An `if`/`while` condition: `let` (also inside `&&` chains) gets a
    /// dedicated message.
    fn condition(&mut self, cond: &Expr, let_message: &str) {
        match unparen(cond) {
            Expr::Let(l) => {
                let (let_token, pat) = (&l.let_token, &l.pat);
                self.errors.error(quote!(#let_token #pat), let_message);
                self.expr(&l.expr, Position::Value);
            }
            Expr::Binary(b) if matches!(b.op, syn::BinOp::And(_)) => {
                self.condition(&b.left, let_message);
                self.condition(&b.right, let_message);
            }
            other => self.expr(other, Position::Value),
        }
    }

    /// The left-hand side of an assignment: places and destructuring.
    fn assignee(&mut self, expr: &Expr) {
        match expr {
            Expr::Infer(_) | Expr::Path(_) => {}
            Expr::Paren(paren) => self.assignee(&paren.expr),
            Expr::Tuple(tuple) => tuple.elems.iter().for_each(|e| self.assignee(e)),
            Expr::Array(array) => array.elems.iter().for_each(|e| self.assignee(e)),
            other => self.expr(other, Position::Value),
        }
    }
}

/// `move |a, b|`: the part of a closure an error points at.
fn closure_head(closure: &ExprClosure) -> proc_macro2::TokenStream {
    let ExprClosure {
        asyncness,
        capture,
        or1_token,
        inputs,
        or2_token,
        ..
    } = closure;
    quote!(#asyncness #capture #or1_token #inputs #or2_token)
}
