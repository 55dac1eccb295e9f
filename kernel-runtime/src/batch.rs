//! Batching (what `jax.vmap` asks of a kernel), done the way Pallas's batching rule does it: a new
//! outermost grid axis walks the batch, and every batched operand gains a leading dimension whose block
//! is one squeezed element selected by that axis. The kernel body is untouched — it still sees the
//! blocks it was written for — so the batched kernel lowers, checks and interprets like any other.

use crate::check;
use crate::dtype::DType;
use crate::error::{kerr, Result};
use crate::ir::{DimensionSemantics, Func, OpKind, OperandRole, Type, ValueId};
use crate::launch::PallasCall;

impl PallasCall {
    /// The kernel mapped over a new leading batch axis of `size`: grid `[size, ..grid]` (the new axis
    /// `parallel`), each output and each input with `batched_inputs[i]` gets a leading array dimension
    /// of `size` and a squeezed block dimension of 1 indexed by the new grid axis; unbatched inputs keep
    /// their shape and ignore the new axis. Scratch persists across the batch like across any axis.
    pub fn batched(&self, size: usize, batched_inputs: &[bool]) -> Result<PallasCall> {
        let mut k = self.kernel.clone();
        let n_inputs = k.inputs().count();
        if batched_inputs.len() != n_inputs {
            return Err(kerr!(
                Signature,
                "batching kernel `{}`: {} batch flags for {n_inputs} inputs",
                k.name,
                batched_inputs.len()
            ));
        }
        if size == 0 {
            return Err(kerr!(
                Grid,
                "batching kernel `{}` over an empty batch",
                k.name
            ));
        }
        k.grid.insert(0, size);
        k.dimension_semantics
            .insert(0, DimensionSemantics::Parallel);
        prepend_index_arg(&mut k.body);
        let mut input_no = 0;
        for o in &mut k.operands {
            let batched = match o.role {
                OperandRole::Input => {
                    input_no += 1;
                    batched_inputs[input_no - 1]
                }
                OperandRole::Output => true,
                OperandRole::Scratch => continue,
            };
            let label = o.label();
            let Some(block) = &mut o.block else {
                if batched {
                    return Err(kerr!(
                        Unsupported,
                        "batching a whole-array (ANY) {} is not supported; pass it unbatched",
                        label
                    )
                    .at(o.loc));
                }
                continue;
            };
            // Every index map takes the new grid index; only batched operands' maps return it (as
            // the block index of their new leading dimension).
            let b = prepend_index_arg(&mut block.index_map);
            if !batched {
                continue;
            }
            o.shape.insert(0, size);
            block.block_shape.insert(0, 1);
            block.squeezed.insert(0, true);
            let ret = block
                .index_map
                .body
                .ops
                .last_mut()
                .filter(|op| op.kind == OpKind::Return)
                .ok_or_else(|| kerr!(Lowering, "index map of {label} has no return"))?;
            ret.operands.insert(0, b);
            block
                .index_map
                .result_types
                .insert(0, Type::Scalar(DType::I32));
        }
        if let Some(c) = &mut k.cost_estimate {
            let n = size as u64;
            c.flops = c.flops.saturating_mul(n);
            c.transcendentals = c.transcendentals.saturating_mul(n);
            c.bytes_accessed = c.bytes_accessed.saturating_mul(n);
        }
        check::grid(&k.grid)?;
        for op in &k.operands {
            let aliased = op.role == crate::ir::OperandRole::Output
                && k.aliases.iter().any(|a| a.1 == op.index);
            check::operand(op, &k.grid, aliased)
                .map_err(|e| e.for_argument(op.label()).at(op.loc))?;
        }
        check::kernel(&k)?;
        Ok(PallasCall { kernel: k })
    }
}

/// A new leading `i32` parameter of `f` (a grid index); existing values keep their ids.
fn prepend_index_arg(f: &mut Func) -> ValueId {
    let v = ValueId(f.values.len() as u32);
    f.values.push(Type::Scalar(DType::I32));
    f.body.args.insert(0, v);
    v
}
