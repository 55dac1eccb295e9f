//! A compact textual form of the kernel IR, for `--emit ir`, debugging and error context.

use super::*;
use std::fmt::{self, Display, Formatter, Write};

impl Display for Type {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let dims = |s: &[usize]| {
            s.iter()
                .map(|&d| match d {
                    DYNAMIC => "?".to_string(),
                    d => d.to_string(),
                })
                .collect::<Vec<_>>()
                .join("x")
        };
        match self {
            Type::Scalar(d) => write!(f, "{d}"),
            Type::Vector(s, d) => write!(f, "[{}]{d}", dims(s)),
            Type::Ref(s, d, m) => write!(f, "ref<{}:[{}]{d}>", m.mosaic(), dims(s)),
        }
    }
}

/// An op kind's printed name (`exp`, `cmp.lt`, `load<..>`), as `--emit ir` shows it.
pub fn op_label(kind: &OpKind) -> String {
    op_name(kind)
}

fn op_name(kind: &OpKind) -> String {
    match kind {
        OpKind::Const(l) => format!("const {l}"),
        OpKind::Unary(u) => u.name().into(),
        OpKind::Composite(c) => c.name().into(),
        OpKind::Binary(b) => b.name().into(),
        OpKind::Compare(c) => format!("cmp.{c:?}").to_lowercase(),
        OpKind::Select => "select".into(),
        OpKind::Cast(d) => format!("cast<{d}>"),
        OpKind::Broadcast => "broadcast".into(),
        OpKind::Iota { dim } => format!("iota<dim={dim}>"),
        OpKind::Reshape => "reshape".into(),
        OpKind::Transpose { perm } => format!("transpose<{perm:?}>"),
        OpKind::Reduce {
            kind,
            axes,
            keepdims,
        } => format!("reduce.{kind:?}<axes={axes:?}, keepdims={keepdims}>").to_lowercase(),
        OpKind::Dot {
            transpose_lhs,
            transpose_rhs,
        } => {
            format!("dot<lhs_t={transpose_lhs}, rhs_t={transpose_rhs}>")
        }
        OpKind::Load(w) => format!("load<{}>", window(w)),
        OpKind::Store { window: w, masked } => {
            format!(
                "store<{}{}>",
                window(w),
                if *masked { ", masked" } else { "" }
            )
        }
        OpKind::RefView(w) => format!("view<{}>", window(w)),
        OpKind::RefBitcast => "ref_bitcast".into(),
        OpKind::RefReshape => "ref_reshape".into(),
        OpKind::Bitcast => "bitcast".into(),
        OpKind::TraceStart(name) => format!("trace_start<{name:?}>"),
        OpKind::TraceStop => "trace_stop".into(),
        OpKind::Scoped => "scoped".into(),
        OpKind::DmaStart => "dma_start".into(),
        OpKind::DmaWait => "dma_wait".into(),
        OpKind::SemSignal => "sem_signal".into(),
        OpKind::SemWait => "sem_wait".into(),
        OpKind::SemRead => "sem_read".into(),
        OpKind::AxisIndex { stride, size } => format!("axis_index<stride={stride}, size={size}>"),
        OpKind::RemoteDmaStart => "remote_dma_start".into(),
        OpKind::RemoteDmaWait { recv } => {
            format!("remote_dma_wait<{}>", if *recv { "recv" } else { "send" })
        }
        OpKind::SemSignalRemote => "sem_signal_remote".into(),
        OpKind::BarrierSemaphore => "barrier_semaphore".into(),
        OpKind::MultipleOf(m) => format!("multiple_of<{m}>"),
        OpKind::If => "if".into(),
        OpKind::For => "for".into(),
        OpKind::While => "while".into(),
        OpKind::Yield => "yield".into(),
        OpKind::Condition => "condition".into(),
        OpKind::Return => "return".into(),
        OpKind::Slice { offsets, sizes } => format!("slice<offsets={offsets:?}, sizes={sizes:?}>"),
        OpKind::Concatenate { dim } => format!("concatenate<dim={dim}>"),
        OpKind::Roll { dim } => format!("roll<dim={dim}>"),
        OpKind::ArgReduce { kind, dim } => format!("{}<dim={dim}>", kind.name()),
    }
}

fn window(w: &Window) -> String {
    let parts: Vec<String> = w
        .starts
        .iter()
        .zip(&w.sizes)
        .zip(&w.squeezed)
        .zip(&w.strides)
        .zip(&w.dynamic_sizes)
        .map(|((((s, n), sq), k), dynamic)| {
            let s = match s {
                Start::Static(v) => v.to_string(),
                Start::Dynamic => "?".into(),
            };
            match (*sq, *k) {
                (true, _) => s,
                (false, _) if *dynamic => format!("{s}:+?"),
                (false, 1) => format!("{s}:+{n}"),
                (false, k) => format!("{s}:+{n}:{k}"),
            }
        })
        .collect();
    parts.join(", ")
}

fn vals(vs: &[ValueId]) -> String {
    vs.iter()
        .map(|v| format!("%{}", v.0))
        .collect::<Vec<_>>()
        .join(", ")
}

fn region(out: &mut String, func: &Func, r: &Region, indent: usize) -> fmt::Result {
    for op in &r.ops {
        let pad = "  ".repeat(indent);
        write!(out, "{pad}")?;
        if !op.results.is_empty() {
            write!(out, "{} = ", vals(&op.results))?;
        }
        write!(out, "{}", op_name(&op.kind))?;
        if !op.operands.is_empty() {
            write!(out, " {}", vals(&op.operands))?;
        }
        if !op.results.is_empty() {
            let tys: Vec<String> = op.results.iter().map(|v| func.ty(*v).to_string()).collect();
            write!(out, " : {}", tys.join(", "))?;
        }
        writeln!(out, "  // {}:{}", op.loc.file, op.loc.line)?;
        for reg in &op.regions {
            writeln!(out, "{pad}  ^({}):", vals(&reg.args))?;
            region(out, func, reg, indent + 2)?;
        }
    }
    Ok(())
}

impl Display for Func {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let args: Vec<String> = self
            .body
            .args
            .iter()
            .map(|v| format!("%{}: {}", v.0, self.ty(*v)))
            .collect();
        let res: Vec<String> = self.result_types.iter().map(|t| t.to_string()).collect();
        let mut body = String::new();
        region(&mut body, self, &self.body, 1)?;
        write!(
            f,
            "fn {}({}) -> ({}) {{\n{body}}}",
            self.name,
            args.join(", "),
            res.join(", ")
        )
    }
}

impl Display for Kernel {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "kernel {} grid={:?} semantics={:?} target={}",
            self.name, self.grid, self.dimension_semantics, self.target
        )?;
        for o in &self.operands {
            write!(
                f,
                "  {}: [{}]{} in {}",
                o.label(),
                join(&o.shape),
                o.dtype,
                o.space.mosaic()
            )?;
            if let Some(b) = &o.block {
                write!(
                    f,
                    " block [{}] via {}",
                    join(&b.block_shape),
                    b.index_map.name
                )?;
            }
            writeln!(f)?;
        }
        writeln!(f, "{}", self.body)?;
        for o in &self.operands {
            if let Some(b) = &o.block {
                writeln!(f, "{}", b.index_map)?;
            }
        }
        Ok(())
    }
}

fn join(s: &[usize]) -> String {
    s.iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join("x")
}
