//! Carried-variable analysis.
//!
//! A traced branch or loop body becomes a closure. Variables from the
//! enclosing code that the body *assigns* cannot be captured mutably (two
//! branch closures would borrow them at once, and the runtime needs the new
//! values as results anyway), so they are passed in and returned explicitly:
//! these are the carried variables.
//!
//! A variable is carried when it is the target of `x = ..`, `x += ..` (any
//! compound assignment), a destructuring assignment `(x, y) = ..`, or is the
//! root of an assigned place (`x.0 = ..`, `x[i] = ..`) anywhere inside the
//! region (recursively, including nested `if`/`for`/`while`), unless a `let`
//! (or loop/closure binding) inside the region declares it in a scope that
//! encloses the assignment. Scoping follows Rust: a `let x` shadows from the
//! next statement to the end of its block, including nested blocks.
//!
//! Names are returned in order of first assignment, without duplicates.

use proc_macro2::Ident;
use syn::visit::{self, Visit};
use syn::{
    Arm, BinOp, Block, Expr, ExprAssign, ExprBinary, ExprClosure, ExprForLoop, ExprIf, ExprLet,
    ExprWhile, Item, Local, Macro, Pat, PatIdent,
};

/// Carried variables of a block (an `if` branch).
pub(crate) fn assigned_in_block(block: &Block) -> Vec<Ident> {
    let mut analysis = Analysis::default();
    analysis.visit_block(block);
    analysis.found
}

/// Carried variables of an expression (an `else` branch, which may be an `if`).
pub(crate) fn assigned_in_expr(expr: &Expr) -> Vec<Ident> {
    let mut analysis = Analysis::default();
    analysis.visit_expr(expr);
    analysis.found
}

/// Carried variables of a loop body; `binding` (the `for` index) is local.
pub(crate) fn assigned_in_loop(binding: Option<&Pat>, body: &Block) -> Vec<Ident> {
    let mut analysis = Analysis::default();
    analysis.scopes.push(Vec::new());
    if let Some(pat) = binding {
        analysis.declare(pat);
    }
    analysis.visit_block(body);
    analysis.found
}

/// Ordered union of two name lists (first occurrence wins).
pub(crate) fn union(first: &[Ident], second: &[Ident]) -> Vec<Ident> {
    let mut all = first.to_vec();
    for ident in second {
        if !contains(&all, ident) {
            all.push(ident.clone());
        }
    }
    all
}

/// Whether `list` has a name equal to `ident`.
pub(crate) fn contains(list: &[Ident], ident: &Ident) -> bool {
    list.iter().any(|i| i == ident)
}

#[derive(Default)]
struct Analysis {
    /// Names declared inside the region, innermost scope last.
    scopes: Vec<Vec<Ident>>,
    /// Carried variables found so far.
    found: Vec<Ident>,
}

impl Analysis {
    fn declare(&mut self, pat: &Pat) {
        let mut bindings = Bindings(Vec::new());
        bindings.visit_pat(pat);
        if self.scopes.is_empty() {
            self.scopes.push(Vec::new());
        }
        if let Some(scope) = self.scopes.last_mut() {
            scope.extend(bindings.0);
        }
    }

    fn record(&mut self, ident: &Ident) {
        // `super += x`, `Self = x`: paths, not variables (a closure cannot bind them); rustc
        // reports the assignment where the user wrote it.
        if ["self", "Self", "super", "crate"]
            .iter()
            .any(|k| ident == k)
        {
            return;
        }
        let local = self.scopes.iter().any(|scope| contains(scope, ident));
        if !local && !contains(&self.found, ident) {
            self.found.push(ident.clone());
        }
    }

    /// The left-hand side of an assignment.
    fn assignee(&mut self, expr: &Expr) {
        match expr {
            Expr::Paren(e) => self.assignee(&e.expr),
            Expr::Group(e) => self.assignee(&e.expr),
            Expr::Tuple(e) => e.elems.iter().for_each(|e| self.assignee(e)),
            Expr::Array(e) => e.elems.iter().for_each(|e| self.assignee(e)),
            Expr::Call(e) => e.args.iter().for_each(|e| self.assignee(e)),
            Expr::Struct(e) => e.fields.iter().for_each(|f| self.assignee(&f.expr)),
            Expr::Path(e) if e.qself.is_none() => {
                if let Some(ident) = e.path.get_ident() {
                    self.record(ident);
                }
            }
            Expr::Field(e) => self.assignee(&e.base),
            Expr::Index(e) => {
                self.assignee(&e.expr);
                self.visit_expr(&e.index);
            }
            other => self.visit_expr(other),
        }
    }

    fn scoped(&mut self, f: impl FnOnce(&mut Self)) {
        self.scopes.push(Vec::new());
        f(self);
        self.scopes.pop();
    }
}

impl<'ast> Visit<'ast> for Analysis {
    fn visit_block(&mut self, block: &'ast Block) {
        self.scoped(|this| visit::visit_block(this, block));
    }

    fn visit_local(&mut self, local: &'ast Local) {
        // The initializer still sees the outer variable: `let x = { x = 1; x };`
        if let Some(init) = &local.init {
            self.visit_expr(&init.expr);
            if let Some((_, diverge)) = &init.diverge {
                self.visit_expr(diverge);
            }
        }
        self.declare(&local.pat);
    }

    fn visit_expr_assign(&mut self, assign: &'ast ExprAssign) {
        self.assignee(&assign.left);
        self.visit_expr(&assign.right);
    }

    fn visit_expr_binary(&mut self, binary: &'ast ExprBinary) {
        if is_compound_assignment(&binary.op) {
            self.assignee(&binary.left);
        } else {
            self.visit_expr(&binary.left);
        }
        self.visit_expr(&binary.right);
    }

    fn visit_expr_for_loop(&mut self, for_loop: &'ast ExprForLoop) {
        self.visit_expr(&for_loop.expr);
        self.scoped(|this| {
            this.declare(&for_loop.pat);
            this.visit_block(&for_loop.body);
        });
    }

    fn visit_expr_if(&mut self, if_expr: &'ast ExprIf) {
        // `if let` bindings are visible in the then-branch only.
        self.scoped(|this| {
            this.visit_expr(&if_expr.cond);
            this.visit_block(&if_expr.then_branch);
        });
        if let Some((_, else_branch)) = &if_expr.else_branch {
            self.visit_expr(else_branch);
        }
    }

    fn visit_expr_while(&mut self, while_expr: &'ast ExprWhile) {
        self.scoped(|this| {
            this.visit_expr(&while_expr.cond);
            this.visit_block(&while_expr.body);
        });
    }

    fn visit_expr_let(&mut self, let_expr: &'ast ExprLet) {
        self.visit_expr(&let_expr.expr);
        self.declare(&let_expr.pat);
    }

    fn visit_expr_closure(&mut self, closure: &'ast ExprClosure) {
        self.scoped(|this| {
            closure.inputs.iter().for_each(|pat| this.declare(pat));
            this.visit_expr(&closure.body);
        });
    }

    fn visit_arm(&mut self, arm: &'ast Arm) {
        self.scoped(|this| {
            this.declare(&arm.pat);
            if let Some((_, guard)) = &arm.guard {
                this.visit_expr(guard);
            }
            this.visit_expr(&arm.body);
        });
    }

    // Nested items and macro bodies are opaque.
    fn visit_item(&mut self, _: &'ast Item) {}
    fn visit_macro(&mut self, _: &'ast Macro) {}
}

/// Collects the names a pattern binds.
struct Bindings(Vec<Ident>);

impl<'ast> Visit<'ast> for Bindings {
    fn visit_pat_ident(&mut self, pat: &'ast PatIdent) {
        self.0.push(pat.ident.clone());
        visit::visit_pat_ident(self, pat);
    }

    // Paths in patterns (`None`, `Foo { .. }`) and macros bind nothing.
    fn visit_expr(&mut self, _: &'ast Expr) {}
    fn visit_macro(&mut self, _: &'ast Macro) {}
}

pub(crate) fn is_compound_assignment(op: &BinOp) -> bool {
    matches!(
        op,
        BinOp::AddAssign(_)
            | BinOp::SubAssign(_)
            | BinOp::MulAssign(_)
            | BinOp::DivAssign(_)
            | BinOp::RemAssign(_)
            | BinOp::BitXorAssign(_)
            | BinOp::BitAndAssign(_)
            | BinOp::BitOrAssign(_)
            | BinOp::ShlAssign(_)
            | BinOp::ShrAssign(_)
    )
}
