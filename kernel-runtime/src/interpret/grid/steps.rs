//! The interpreter's side of the block schedule: a chunk of grid steps run by one machine — blocks
//! read from the inputs (padded at the edges), output blocks written back through the sinks.

use super::*;
use crate::interpret::machine::{write_view, write_view_raw};
use crate::ir::{MemSpace, SemKind};

/// The interpreter's side of the schedule: one chunk's machine and the runner's arrays.
pub(super) struct Chunk<'r, 'a> {
    runner: &'r Runner<'a>,
    m: &'r mut Machine<'a>,
    /// Index-map scratch registers.
    env: Vec<i64>,
}

impl BlockEngine for Chunk<'_, '_> {
    fn block_index(&mut self, i: usize, point: &[i64], idx: &mut Vec<i64>) -> Result<()> {
        let Some(map) = &self.runner.maps[i] else {
            return Err(internal("an operand without an index map"));
        };
        map.eval(point, &mut self.env, idx)?;
        // Blocks chosen by scalar-prefetch data are checked here (`build()` checked the others).
        if map.reads_data() {
            check_data_block(&self.runner.k.operands[i], point, idx)?;
        }
        Ok(())
    }

    fn copy_in(&mut self, i: usize, n: usize, idx: &[i64]) -> Result<()> {
        let block = self.runner.k.operands[i]
            .block
            .as_ref()
            .ok_or_else(|| internal("input without a block"))?;
        self.m.refs[i].content = Some(input_block(
            &self.runner.inputs[n],
            block,
            idx,
            self.runner.poison,
        )?);
        Ok(())
    }

    fn write_back(&mut self, i: usize, n: usize, idx: &[i64]) -> Result<()> {
        self.runner.write_back(self.m, i, n, idx)
    }

    fn start_output(&mut self, i: usize, n: usize, idx: &[i64]) -> Result<()> {
        if let Some(old) = self.m.refs[i].content.take() {
            recycle(old);
        }
        self.m.refs[i].written_through = false;
        self.m.dests[i] = self.runner.dest(i, n, idx)?;
        Ok(())
    }

    fn step(&mut self, point: &[i64]) -> Result<()> {
        self.m.step(self.runner.plan, point)
    }

    fn cross(&mut self, point: &[i64], axis: usize) -> Result<()> {
        let k = self.runner.k;
        let dma = |r: usize| {
            k.operands
                .get(r)
                .is_some_and(|o| o.space == MemSpace::Sem(SemKind::Dma))
        };
        self.m.dma.cross(&self.m.refs[..], point, axis, dma)
    }
}

pub(super) struct Runner<'a> {
    pub(super) k: &'a Kernel,
    /// Each operand's index map (None for whole-array operands and scratch).
    pub(super) maps: Vec<Option<IndexMap<'a>>>,
    pub(super) inputs: &'a [Input],
    pub(super) sinks: &'a [Sink],
    pub(super) plan: &'a Plan,
    pub(super) poison: bool,
    /// Seed of the DMA completion points (`InterpretOptions::dma_seed`).
    pub(super) dma_seed: Option<u64>,
}

impl<'a> Runner<'a> {
    /// A machine for grid steps whose split loops may use `loop_threads` threads.
    pub(super) fn machine(&self, loop_threads: usize) -> Machine<'a> {
        let refs = self
            .k
            .operands
            .iter()
            .map(|o| RefState {
                dtype: o.dtype,
                shape: o.ref_shape().into(),
                content: None,
                label: o.label().into(),
                written_through: false,
                blocked: o.block.is_some(),
            })
            .collect();
        Machine::new(&self.k.body, refs, self.poison).with_loop_threads(loop_threads)
    }

    /// Run every grid point whose parallel coordinates are `key`, in order, then write back.
    pub(super) fn chunk(&self, m: &mut Machine<'a>, par_axes: &[usize], key: &[i64]) -> Result<()> {
        let k = self.k;
        let mut input_no = 0;
        for (i, o) in k.operands.iter().enumerate() {
            if let Some(old) = m.refs[i].content.take() {
                recycle(old);
            }
            m.refs[i].written_through = false;
            m.dests[i] = None;
            if o.role == OperandRole::Input {
                if o.block.is_none() {
                    m.refs[i].content = Some(whole(&self.inputs[input_no]));
                }
                input_no += 1;
            }
        }
        // A whole output in HBM (ANY) starts as its target holds it (the input, when aliased) or
        // the fill value, and is written back whole after the grid.
        let mut out_no = 0;
        for (i, o) in k.operands.iter().enumerate() {
            if o.role != OperandRole::Output {
                continue;
            }
            if o.block.is_none() {
                let aliased = k.aliases.iter().find(|a| a.1 == out_no).map(|a| a.0);
                m.refs[i].content =
                    Some(self.whole_output(o, aliased, out_no, m.loop_threads())?);
            }
            out_no += 1;
        }
        m.dma = crate::interpret::machine::DmaModel::new(self.dma_seed);
        let mut chunk = Chunk {
            runner: self,
            m,
            env: Vec::new(),
        };
        walk_grid(k, par_axes, key, &mut chunk)?;
        chunk.m.dma_finish()?;
        let mut out_no = 0;
        for (i, o) in k.operands.iter().enumerate() {
            if o.role != OperandRole::Output {
                continue;
            }
            if o.block.is_none() {
                let content = chunk.m.refs[i]
                    .content
                    .take()
                    .ok_or_else(|| internal("whole output without contents"))?;
                self.write_whole(out_no, &content)?;
                recycle(content);
            }
            out_no += 1;
        }
        Ok(())
    }

    /// The starting contents of a whole (ANY) output: its own array holding its aliased input
    /// ([`Runner::lend_sink`]), else its aliased input's buffer, shared (the first write copies it;
    /// see `start_aliased_outputs`), else the fill value.
    fn whole_output(
        &self,
        o: &crate::ir::Operand,
        aliased: Option<usize>,
        out_no: usize,
        threads: usize,
    ) -> Result<Tensor> {
        let Some(input_no) = aliased else {
            return Ok(Tensor::splat(fill_literal(o.dtype, self.poison), &o.shape));
        };
        let a = self
            .inputs
            .get(input_no)
            .ok_or_else(|| internal("aliased input"))?;
        if a.dtype != o.dtype || a.shape != o.shape {
            return Err(internal("aliased input and output differ"));
        }
        if let Some(t) = self.lend_sink(a, (input_no, out_no), threads)? {
            return Ok(t);
        }
        Ok(whole(a))
    }

    /// A whole output aliased to input `input_no` (`a`), updated in place in its own array: the
    /// array starts as the input (copied in, or there already when XLA gave the input's buffer as
    /// the output's), and the ref's contents are the array itself, lent ([`Buf::Shared`]): no copy at
    /// the first write, none back after the grid. `None` where the array is the input's buffer and
    /// the kernel reads the input operand (which must read the input as it was), or the array
    /// cannot be written as typed elements.
    /// The copy in runs on up to `threads` threads.
    fn lend_sink(
        &self,
        a: &Input,
        (input_no, out_no): (usize, usize),
        threads: usize,
    ) -> Result<Option<Tensor>> {
        let sink = self
            .sinks
            .get(out_no)
            .ok_or_else(|| internal("output sink"))?;
        let n: usize = a.shape.iter().product();
        let size = host_size(a.dtype);
        if sink.dtype != a.dtype
            || sink.len < n
            || n == 0
            || !(sink.ptr as usize).is_multiple_of(size)
        {
            return Ok(None);
        }
        let src = crate::interpret::elementwise::with_dtype!(a.dtype, T => {
            a.buf.slice::<T>().filter(|s| s.len() >= n).map(|s| s.as_ptr().cast::<u8>())
        });
        let Some(src) = src else { return Ok(None) };
        let bytes = n * size;
        if src == sink.ptr.cast_const() {
            if self.reads_input(input_no) {
                return Ok(None);
            }
        } else if overlaps((src, bytes), (sink.ptr, bytes)) {
            return Ok(None);
        } else {
            // SAFETY: `src` holds `n` initialized elements (`slice` above) and the sink has room for
            // `len >= n` (checked); they do not overlap (checked), and the sink is this run's output
            // array, which only this chunk writes (whole outputs run the kernel as one chunk).
            unsafe { crate::interpret::workers::copy_bytes(src, sink.ptr, bytes, threads) };
        }
        Ok(Some(Tensor {
            dtype: a.dtype,
            shape: a.shape.as_slice().into(),
            strides: row_major_strides(&a.shape),
            offset: 0,
            buf: Buf::Shared(crate::interpret::tensor::Shared {
                dtype: a.dtype,
                ptr: sink.ptr,
                len: n,
            }),
        }))
    }

    /// Whether the kernel body reads input `input_no`'s operand anywhere.
    fn reads_input(&self, input_no: usize) -> bool {
        fn uses(r: &crate::ir::Region, v: crate::ir::ValueId) -> bool {
            r.ops
                .iter()
                .any(|op| op.operands.contains(&v) || op.regions.iter().any(|r| uses(r, v)))
        }
        let k = self.k;
        let Some(j) = k
            .operands
            .iter()
            .enumerate()
            .filter(|(_, o)| o.role == OperandRole::Input)
            .nth(input_no)
            .map(|(j, _)| j)
        else {
            return true;
        };
        let args = &k.body.body.args;
        match args.len().checked_sub(k.operands.len()) {
            Some(first) => uses(&k.body.body, args[first + j]),
            None => true,
        }
    }

    /// Write a whole output's contents to its array and mark it written.
    fn write_whole(&self, out_no: usize, content: &Tensor) -> Result<()> {
        let sink = self
            .sinks
            .get(out_no)
            .ok_or_else(|| internal("output sink"))?;
        if sink.dtype != content.dtype || content.numel() > sink.len {
            return Err(internal("whole output type"));
        }
        let strides = crate::interpret::tensor::row_major_strides(&content.shape);
        // Contents still in the output array's own memory (an aliased input XLA gave as the output's
        // buffer, never written): in place already when they are the array as it lies, else copied
        // out first (a view of a buffer must not be written onto it).
        let bytes = sink.len * host_size(sink.dtype);
        let copy;
        let content = match &content.buf {
            // Updated in place in the array (`lend_sink`).
            Buf::Shared(s) if s.ptr == sink.ptr => {
                for w in &sink.written {
                    w.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                return Ok(());
            }
            Buf::Foreign(f) if overlaps((f.ptr, f.len * host_size(f.dtype)), (sink.ptr, bytes)) => {
                if f.ptr == sink.ptr.cast_const()
                    && content.offset == 0
                    && content.strides[..] == strides[..]
                {
                    for w in &sink.written {
                        w.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    return Ok(());
                }
                copy = content.materialize()?;
                &copy
            }
            _ => content,
        };
        crate::interpret::elementwise::with_dtype!(content.dtype, T => {
            // SAFETY: the sink points at a live output buffer with room for `len >= numel`
            // elements; whole outputs make the kernel run as one chunk (see `parallel_axes`).
            unsafe { write_view_raw::<T>(sink.ptr as *mut T, sink.len, 0, &strides, content, None)? }
        });
        for w in &sink.written {
            w.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    /// Copy output ref `i`'s block (block index `idx`) into output array `out_no`, clipped to the array.
    fn write_back(&self, m: &mut Machine<'a>, i: usize, out_no: usize, idx: &[i64]) -> Result<()> {
        let through = std::mem::replace(&mut m.refs[i].written_through, false);
        m.dests[i] = None;
        let r = &mut m.refs[i];
        match r.content.take() {
            // The block was computed in place in the output array.
            None if through => self.mark_written(i, out_no, idx),
            content => {
                let content = content
                    .unwrap_or_else(|| Tensor::splat(fill_literal(r.dtype, self.poison), &r.shape));
                self.write_block(i, out_no, idx, &content)?;
                recycle(content);
                Ok(())
            }
        }
    }

    /// Where block `idx` of output operand `i` sits in its array: element offset, strides of the kernel
    /// dims, the block's kernel shape clipped to the array, and whether it needed clipping.
    fn geometry(&self, i: usize, idx: &[i64]) -> Result<(usize, Vec<usize>, Vec<usize>, bool)> {
        let o = &self.k.operands[i];
        let block = o
            .block
            .as_ref()
            .ok_or_else(|| internal("output without a block"))?;
        let astr = row_major_strides(&o.shape);
        let (mut off, mut strides, mut clipped, mut cut) = (0, Vec::new(), Vec::new(), false);
        for d in 0..o.shape.len() {
            let start = idx[d] as usize * block.block_shape[d];
            off += start * astr[d];
            cut |= start + block.block_shape[d] > o.shape[d];
            if !block.squeezed[d] {
                strides.push(astr[d]);
                clipped.push(block.block_shape[d].min(o.shape[d] - start));
            }
        }
        Ok((off, strides, clipped, cut))
    }

    /// The output array region of block `idx` as a direct destination, if the block lies inside it.
    fn dest(&self, i: usize, out_no: usize, idx: &[i64]) -> Result<Option<RawDest>> {
        let (off, strides, shape, cut) = self.geometry(i, idx)?;
        let sink = self
            .sinks
            .get(out_no)
            .ok_or_else(|| internal("output sink"))?;
        Ok((!cut).then_some(RawDest {
            ptr: sink.ptr,
            len: sink.len,
            off,
            strides: strides.into(),
            shape: shape.into(),
            dtype: sink.dtype,
        }))
    }

    /// Write `content` as block `idx` of output array `out_no` (operand `i`), clipped to the array.
    pub(super) fn write_block(
        &self,
        i: usize,
        out_no: usize,
        idx: &[i64],
        content: &Tensor,
    ) -> Result<()> {
        let (off, strides, clipped, _) = self.geometry(i, idx)?;
        let zeros = vec![0; clipped.len()];
        let src = content.window(&zeros, &clipped, &vec![false; clipped.len()]);
        let sink = self
            .sinks
            .get(out_no)
            .ok_or_else(|| internal("output sink"))?;
        if sink.dtype != src.dtype {
            return Err(internal("output dtype"));
        }
        crate::interpret::elementwise::with_dtype!(src.dtype, T => {
            // SAFETY: the sink points at a live output buffer with room for `len` elements of this
            // dtype; chunks write disjoint blocks (see `parallel_axes`), and `write_view_raw`
            // bounds-checks each row and only writes (never reads) the destination.
            unsafe { write_view_raw::<T>(sink.ptr as *mut T, sink.len, off, &strides, &src, None)? }
        });
        self.mark_written(i, out_no, idx)
    }

    fn mark_written(&self, i: usize, out_no: usize, idx: &[i64]) -> Result<()> {
        let o = &self.k.operands[i];
        let block = o
            .block
            .as_ref()
            .ok_or_else(|| internal("output without a block"))?;
        let sink = self
            .sinks
            .get(out_no)
            .ok_or_else(|| internal("output sink"))?;
        let n: Vec<usize> = o
            .shape
            .iter()
            .zip(&block.block_shape)
            .map(|(a, s)| a.div_ceil(*s))
            .collect();
        let lin = idx
            .iter()
            .zip(&n)
            .fold(0usize, |acc, (&x, &nb)| acc * nb + x as usize);
        if let Some(w) = sink.written.get(lin) {
            w.store(true, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// A whole input array as a tensor (shares the caller's buffer).
fn whole(a: &Input) -> Tensor {
    Tensor {
        dtype: a.dtype,
        shape: a.shape.as_slice().into(),
        strides: row_major_strides(&a.shape),
        offset: 0,
        buf: a.buf.clone(),
    }
}

/// The input block at `idx`: a view of the caller's array, or a padded copy for an edge block that
/// runs past the array (padding reads as the fill value, like unspecified VMEM on the TPU).
fn input_block(a: &Input, block: &BlockIr, idx: &[i64], poison: bool) -> Result<Tensor> {
    let shape = a.shape.as_slice();
    let starts: Vec<usize> = (0..shape.len())
        .map(|d| idx[d] as usize * block.block_shape[d])
        .collect();
    let inside = (0..shape.len()).all(|d| starts[d] + block.block_shape[d] <= shape[d]);
    let w = whole(a);
    if inside {
        return Ok(w.window(&starts, &block.block_shape, &block.squeezed));
    }
    let clipped: Vec<usize> = (0..shape.len())
        .map(|d| block.block_shape[d].min(shape[d] - starts[d]))
        .collect();
    let src = w.window(&starts, &clipped, &block.squeezed);
    let kshape = block.kernel_shape();
    let n = kshape.iter().product();
    let mut data = HostData::filled(fill_literal(a.dtype, poison), n);
    let strides = row_major_strides(&kshape);
    crate::interpret::elementwise::with_dtype!(a.dtype, T => {
        let dst = T::vec_mut(&mut data).ok_or_else(|| internal("block buffer type"))?;
        write_view(dst, 0, &strides, &src, None)?;
    });
    Ok(Tensor {
        dtype: a.dtype,
        shape: kshape.into(),
        strides,
        offset: 0,
        buf: Buf::host(data),
    })
}

/// Whether two byte ranges `(start, length)` share a byte.
fn overlaps((a, na): (*const u8, usize), (b, nb): (*mut u8, usize)) -> bool {
    let (a, b) = (a as usize, b as usize);
    a < b + nb && b < a + na
}
