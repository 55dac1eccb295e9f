//! Index maps compiled once into a flat program over an `i64` register file, so the checks (every
//! grid point of a launch) and the interpreter's grid loop (every step) evaluate them without
//! allocating. Same arithmetic as [`crate::check::eval_index_map`]
//! (which reports the errors for anything this does not handle).

use crate::check::{eval_index_map, eval_index_map_with, Prefetched};
use crate::error::Result;
use crate::ir::{BinaryOp, Func, OpKind};

#[derive(Clone, Debug)]
enum Step {
    Const(usize, i64),
    Copy(usize, usize),
    Bin(BinaryOp, usize, usize, usize),
}

#[derive(Clone, Debug)]
pub(crate) struct IndexFn {
    n: usize,
    args: Vec<usize>,
    steps: Vec<Step>,
    ret: Vec<usize>,
}

impl IndexFn {
    /// Compile `f`; `None` if it uses something only the general evaluator handles.
    pub fn compile(f: &Func) -> Option<IndexFn> {
        let mut steps = Vec::new();
        let mut ret = None;
        for op in &f.body.ops {
            let r = op.results.first().map(|v| v.0 as usize);
            let a = |i: usize| op.operands.get(i).map(|v| v.0 as usize);
            match &op.kind {
                OpKind::Const(l) => steps.push(Step::Const(r?, l.as_i64())),
                OpKind::MultipleOf(_) => steps.push(Step::Copy(r?, a(0)?)),
                OpKind::Binary(
                    b @ (BinaryOp::Add
                    | BinaryOp::Sub
                    | BinaryOp::Mul
                    | BinaryOp::Div
                    | BinaryOp::Rem
                    | BinaryOp::Max
                    | BinaryOp::Min),
                ) => steps.push(Step::Bin(*b, r?, a(0)?, a(1)?)),
                OpKind::Return => {
                    ret = Some(op.operands.iter().map(|v| v.0 as usize).collect());
                    break;
                }
                _ => return None,
            }
        }
        Some(IndexFn {
            n: f.values.len(),
            args: f.body.args.iter().map(|v| v.0 as usize).collect(),
            steps,
            ret: ret?,
        })
    }

    /// Block indices at grid point `point`, into `out`; `env` is scratch. Falls back to the general
    /// evaluator (and its error) on division by zero.
    pub fn eval(
        &self,
        f: &Func,
        point: &[i64],
        env: &mut Vec<i64>,
        out: &mut Vec<i64>,
    ) -> Result<()> {
        env.clear();
        env.resize(self.n, 0);
        for (a, v) in self.args.iter().zip(point) {
            env[*a] = *v;
        }
        let wrap = |x: i64| x as i32 as i64;
        for s in &self.steps {
            match *s {
                Step::Const(r, c) => env[r] = c,
                Step::Copy(r, a) => env[r] = env[a],
                Step::Bin(b, r, x, y) => {
                    let (x, y) = (env[x], env[y]);
                    env[r] = match b {
                        BinaryOp::Add => wrap(x + y),
                        BinaryOp::Sub => wrap(x - y),
                        BinaryOp::Mul => wrap(x * y),
                        BinaryOp::Div | BinaryOp::Rem if y == 0 => {
                            *out = eval_index_map(f, point)?;
                            return Ok(());
                        }
                        BinaryOp::Div => x / y,
                        BinaryOp::Rem => x % y,
                        BinaryOp::Max => x.max(y),
                        _ => x.min(y),
                    };
                }
            }
        }
        out.clear();
        out.extend(self.ret.iter().map(|r| env[*r]));
        Ok(())
    }
}

/// An index map: compiled when possible, else evaluated by the general evaluator (with the
/// scalar-prefetch data when it reads it).
pub(crate) struct IndexMap<'k> {
    func: &'k Func,
    compiled: Option<IndexFn>,
    prefetch: Vec<Prefetched<'k>>,
}

impl<'k> IndexMap<'k> {
    pub fn new(func: &'k Func) -> Self {
        Self::with_prefetch(func, Vec::new())
    }
    /// A map that may read the scalar-prefetch operands `prefetch`.
    pub fn with_prefetch(func: &'k Func, prefetch: Vec<Prefetched<'k>>) -> Self {
        IndexMap {
            func,
            compiled: IndexFn::compile(func),
            prefetch,
        }
    }
    /// Whether the blocks depend on scalar-prefetch data (so they are checked when the map runs).
    pub fn reads_data(&self) -> bool {
        self.compiled.is_none() && self.func.reads_refs()
    }
    pub fn eval(&self, point: &[i64], env: &mut Vec<i64>, out: &mut Vec<i64>) -> Result<()> {
        match &self.compiled {
            Some(c) => c.eval(self.func, point, env, out),
            None if self.prefetch.is_empty() => {
                *out = eval_index_map(self.func, point)?;
                Ok(())
            }
            None => {
                *out = eval_index_map_with(self.func, point, &self.prefetch)?;
                Ok(())
            }
        }
    }
}
