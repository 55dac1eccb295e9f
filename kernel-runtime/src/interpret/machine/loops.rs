//! Loops: a `for` loop's iterations (its induction variable and carried values bound in place
//! each time) and a `while` loop's, one after another on this machine (a split `for` loop runs
//! across threads in `split.rs`).

use super::*;

impl<'k> Machine<'k> {
    /// The values `ids` denote (`what`: the error's name for them when one is undefined).
    pub(super) fn values(&self, ids: &[ValueId], what: &str) -> Result<Values> {
        ids.iter()
            .map(|v| {
                self.env[v.0 as usize]
                    .clone()
                    .ok_or_else(|| internal(&format!("undefined {what}")))
            })
            .collect()
    }

    /// A `for` loop's bounds and (positive) step, its body with the body's plan, and the induction
    /// variable's type.
    pub(super) fn loop_parts<'o>(&self, op: &'o Op, sub: &'o [Plan]) -> Result<LoopParts<'o>> {
        let bound = |i: usize| -> Result<i64> {
            let v = op.operands.get(i).ok_or_else(|| internal("for bounds"))?;
            self.tensor(*v)?.scalar_i64()
        };
        let (lo, hi, step) = (bound(0)?, bound(1)?, bound(2)?);
        if step <= 0 {
            return Err(kerr!(
                OutOfBounds,
                "a `for` loop step must be positive, got {step}"
            ));
        }
        let (Some(body), Some(plan)) = (op.regions.first(), sub.first()) else {
            return Err(internal("for without a body"));
        };
        let iv_dtype = body
            .args
            .first()
            .map(|a| self.func.ty(*a).dtype())
            .unwrap_or(DType::I32);
        Ok(((lo, hi, step), body, plan, iv_dtype))
    }

    pub(super) fn for_loop(&mut self, op: &Op, sub: &[Plan]) -> Result<Values> {
        let ((lo, hi, step), body, plan, iv_dtype) = self.loop_parts(op, sub)?;
        let mut carried = self.values(&op.operands[3..], "for init")?;
        let mut iv = lo;
        while iv < hi {
            // The induction variable and the carried values bound in place (no list per iteration).
            let iv_value = Value::T(Tensor::splat(Literal::from_i64(iv_dtype, iv), &[]));
            let args = std::iter::once(iv_value).chain(carried.drain(..));
            for (a, v) in body.args.iter().zip(args) {
                self.env[a.0 as usize] = Some(v);
            }
            carried = self.region_ops(body, plan)?;
            iv += step;
        }
        Ok(carried)
    }

    pub(super) fn while_loop(&mut self, op: &Op, sub: &[Plan]) -> Result<Values> {
        let (Some(before), Some(after), Some(pb), Some(pa)) = (
            op.regions.first(),
            op.regions.get(1),
            sub.first(),
            sub.get(1),
        ) else {
            return Err(internal("while without its regions"));
        };
        let mut carried = self.values(&op.operands, "while init")?;
        loop {
            let mut out = self.region(before, pb, carried)?;
            if out.is_empty() {
                return Err(internal("while condition without a value"));
            }
            let rest: Values = out.drain(1..).collect();
            let go = match &out[0] {
                Value::T(t) => t.scalar_bool()?,
                _ => return Err(internal("while condition is not a value")),
            };
            if !go {
                return Ok(rest);
            }
            carried = self.region(after, pa, rest)?;
        }
    }
}
