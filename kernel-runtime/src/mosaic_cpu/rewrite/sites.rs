//! Run-time checks in the rewritten code: a [`Site`] per check (what it checks, where in the user's
//! Rust, which ref), the error buffer's layout ([`ERR_SLOTS`]), the source locations ([`Files`]) that
//! checks and rewrite errors point at, and the [`Rewriter`]'s `site`/`record`, which register a check
//! and write its failure into the error buffer. `run.rs` turns a recorded failure into the error.
//!
//! May depend on: the [`Rewriter`] and its types, its code-writing helpers (`emit.rs`), mlir-sys
//! (reading a location), `crate::error`.

use super::{RefId, Rewriter, Ty, Val};
use crate::error::{Result, SourceLoc};
use melior::ir::operation::{OperationLike, OperationRef};
use melior::ir::Location;

/// A run-time check in the rewritten code; its number (index + 1) is what the code writes into the
/// error slot when the check fails.
#[derive(Clone, Debug)]
pub(in crate::mosaic_cpu) struct Site {
    pub kind: SiteKind,
    pub loc: SourceLoc,
    /// The ref a load, store, window or semaphore op reads or writes.
    pub ref_id: Option<RefId>,
}

#[derive(Clone, Debug)]
pub(in crate::mosaic_cpu) enum SiteKind {
    /// A `vector.load` window outside its ref (sizes, ref shape); the starts are reported.
    Load {
        sizes: Vec<usize>,
        shape: Vec<usize>,
    },
    /// A `tpu.vector_store` window (with its strides) outside its ref.
    Store {
        sizes: Vec<usize>,
        shape: Vec<usize>,
    },
    /// A `memref.load` / `memref.store` of one element (an SMEM ref) outside its ref, in the kernel or
    /// (`index_map`) in an index map reading a scalar-prefetch operand; the indices are reported.
    Element {
        store: bool,
        shape: Vec<usize>,
        index_map: bool,
    },
    /// A `tpu.memref_slice` window (of `sizes`) outside its base (of `shape`); the starts are reported.
    Slice {
        sizes: Vec<usize>,
        shape: Vec<usize>,
    },
    /// A run-time window size (along `dim`) below one element; the size is reported.
    SliceSize { dim: usize },
    /// A `tpu.memref_slice` window with run-time sizes leaving its base (of `shape`) along `dim`; the
    /// start and size are reported.
    SliceDim { dim: usize, shape: Vec<usize> },
    /// A `tpu.enqueue_dma` whose ends (of rank `rank`, with run-time sizes) differ in shape; the
    /// source's extents then the target's are reported.
    DmaShape { rank: usize },
    /// A `tpu.wait_dma` on a DMA semaphore (of a ref of `shape`) that no copy signalled: it would
    /// never return. The semaphore's element is reported.
    DmaWait { shape: Vec<usize> },
    /// A `tpu.sem_wait` for more than the semaphore (of a ref of `shape`) holds, which nothing else
    /// will signal: the element, the amount and the value are reported.
    SemWait { shape: Vec<usize> },
    /// A semaphore of a `run_scoped` scope (of `shape`; `dma`: a DMA semaphore) not back at zero when
    /// the scope ends: the element and its value are reported.
    ScopeEnd { dma: bool, shape: Vec<usize> },
    /// `tpu.assume_multiple` on a value that is not a multiple (the value is reported).
    AssumeMultiple(i64),
    /// An `scf.for` whose step is not positive (the step is reported).
    ForStep,
}

/// Slots of the error buffer every rewritten function takes last: `[site, detail...]` (a copy of
/// rank 5 with run-time sizes reports both ends' extents: 1 + 2 · 5).
pub(in crate::mosaic_cpu) const ERR_SLOTS: usize = 12;

/// The emitted module's source files, to turn MLIR locations back into `SourceLoc`s.
pub(in crate::mosaic_cpu) struct Files {
    pub known: Vec<&'static str>,
    pub fallback: SourceLoc,
}

impl Files {
    /// The `SourceLoc` of an MLIR `file:line:col` location (the fallback for any other kind).
    pub fn loc(&self, loc: Location<'_>) -> SourceLoc {
        let raw = loc.to_raw();
        // SAFETY: `raw` is a live location of the module being rewritten; the filename identifier it
        // returns is owned by the context and read before the call returns.
        let (file, line, col) = unsafe {
            if !mlir_sys::mlirLocationIsAFileLineColRange(raw) {
                return self.fallback;
            }
            let ident = mlir_sys::mlirLocationFileLineColRangeGetFilename(raw);
            let s = mlir_sys::mlirIdentifierStr(ident);
            let bytes = std::slice::from_raw_parts(s.data as *const u8, s.length);
            (
                String::from_utf8_lossy(bytes).into_owned(),
                mlir_sys::mlirLocationFileLineColRangeGetStartLine(raw),
                mlir_sys::mlirLocationFileLineColRangeGetStartColumn(raw),
            )
        };
        match self.known.iter().find(|f| **f == file) {
            Some(f) => SourceLoc {
                file: f,
                line: line.max(0) as u32,
                col: col.max(0) as u32,
            },
            None => self.fallback,
        }
    }
}

impl Rewriter<'_> {
    /// Register a run-time check and return its number.
    pub fn site(&mut self, op: OperationRef<'_, '_>, kind: SiteKind, ref_id: Option<RefId>) -> i64 {
        self.sites.push(Site {
            kind,
            loc: self.files.loc(op.location()),
            ref_id,
        });
        self.sites.len() as i64
    }

    /// Record check `site` as failed with `details` (index or i32/i64 scalars), unless an earlier
    /// failure is recorded.
    pub fn record(&mut self, site: i64, details: &[Val]) -> Result<()> {
        let err = Val {
            name: self.err.clone(),
            ty: Ty::Mem {
                shape: vec![ERR_SLOTS],
                elem: "i64".into(),
            },
        };
        let c0 = self.index(0);
        let first = self.load(&err, &c0);
        let zero = self.int(0, "i64");
        let clean = self.fresh();
        self.line(format!("{clean} = arith.cmpi eq, {first}, {zero} : i64"));
        self.if_else(
            &clean,
            |rw| {
                let id = rw.int(site, "i64");
                rw.store(&id, &err, &c0);
                for (slot, d) in details.iter().take(ERR_SLOTS - 1).enumerate() {
                    let v = match d.ty.elem() {
                        "i64" => d.name.clone(),
                        "index" => {
                            let v = rw.fresh();
                            rw.line(format!("{v} = arith.index_cast {} : index to i64", d.name));
                            v
                        }
                        t => {
                            let v = rw.fresh();
                            rw.line(format!("{v} = arith.extsi {} : {t} to i64", d.name));
                            v
                        }
                    };
                    let at = rw.index(slot + 1);
                    rw.store(&v, &err, &at);
                }
                Ok(())
            },
            |_| Ok(()),
        )
    }
}
