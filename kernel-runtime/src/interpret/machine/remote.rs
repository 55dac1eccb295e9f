//! The ops that talk to other devices, in an SPMD run ([`crate::interpret::spmd`]): this device's
//! index along a mesh axis, remote copies (sent at their start, received into the DMA model as copies
//! in flight), remote signals, the barrier semaphore. Outside an SPMD run there is one device and no
//! mesh: they are refused at their line.

use super::super::spmd::{Delivery, Link, Mail};
use super::*;
use crate::semantics::dma::window_bytes;
use std::sync::Arc;

impl Machine<'_> {
    fn link(&self, op: &Op) -> Result<Arc<Link>> {
        self.link.clone().ok_or_else(|| {
            kerr!(
                Unsupported,
                "`{}` talks to other devices of the mesh, and `interpret` runs one device: run the kernel on every device of its mesh with `interpret_spmd`",
                crate::ir::op_label(&op.kind)
            )
        })
    }

    /// `AxisIndex`, `RemoteDmaStart`, `RemoteDmaWait`, `SemSignalRemote`, `BarrierSemaphore`.
    pub(super) fn remote_op(&mut self, op: &Op) -> Result<Values> {
        let link = self.link(op)?;
        match op.kind {
            OpKind::AxisIndex { stride, size } => {
                let i = (link.me / stride.max(1) as usize) % size.max(1) as usize;
                let l = Literal::from_i64(DType::I32, i as i64);
                Ok(smallvec::smallvec![Value::T(Tensor::splat(l, &[]))])
            }
            OpKind::BarrierSemaphore => Ok(smallvec::smallvec![Value::Ref(self.barrier)]),
            OpKind::SemSignalRemote => {
                let sem = self.semaphore(op.operands[0])?;
                let n = self.tensor(op.operands[1])?.scalar_i64()?;
                let to = self.device(&link, op.operands[2])?;
                link.send(to, Mail::Signal { sem, n }, "a semaphore signal")
                    .map(|_| Values::new())
            }
            OpKind::RemoteDmaStart => {
                let (src, dst) = (self.view_of(op.operands[0])?, self.view_of(op.operands[1])?);
                let (send, recv) = (
                    self.semaphore(op.operands[2])?,
                    self.semaphore(op.operands[3])?,
                );
                let to = self.device(&link, op.operands[4])?;
                let peer = Peer {
                    device: to,
                    outgoing: true,
                    tag: 0,
                };
                let ends = (src.clone(), dst.clone());
                self.dma
                    .start(&self.refs[..], ends, send, Some(peer), op.loc)?;
                let data = self.read_window(&src)?.materialize()?;
                let mail = Mail::Copy(Box::new(Delivery {
                    from: link.me,
                    src,
                    dst,
                    data,
                    sem: recv,
                    loc: op.loc,
                }));
                link.send(to, mail, "a copy").map(|_| Values::new())
            }
            OpKind::RemoteDmaWait { recv } => {
                let dst = self.view_of(op.operands[1])?;
                let sem = self.semaphore(op.operands[if recv { 3 } else { 2 }])?;
                self.device(&link, op.operands[4])?;
                let bytes = window_bytes(&self.refs[..], &dst);
                self.take_bytes(sem, bytes, op).map(|_| Values::new())
            }
            _ => Err(internal("not an op across devices")),
        }
    }

    /// The device id operand `id`, checked to be in the mesh.
    fn device(&self, link: &Link, id: ValueId) -> Result<usize> {
        let d = self.tensor(id)?.scalar_i64()?;
        let n = link.mesh().devices();
        if d < 0 || d as u64 >= n as u64 {
            return Err(kerr!(
                OutOfBounds,
                "device id {d} is outside the mesh {} (devices 0..{n})",
                link.mesh().describe()
            ));
        }
        Ok(d as usize)
    }

    /// Take the deliveries waiting for this device: copies become copies in flight into their
    /// destinations (their data kept until a wait lands them), signals add to their semaphores.
    pub(super) fn receive(&mut self) -> Result<()> {
        let Some(link) = self.link.clone() else {
            return Ok(());
        };
        for mail in link.take_mail() {
            match mail {
                Mail::Copy(d) => {
                    let tag = link.tag();
                    let peer = Peer {
                        device: d.from,
                        outgoing: false,
                        tag,
                    };
                    let Delivery {
                        src,
                        dst,
                        data,
                        sem,
                        loc,
                        ..
                    } = *d;
                    self.dma
                        .start(&self.refs[..], (src, dst), sem, Some(peer), loc)?;
                    self.received.insert(tag, data);
                }
                Mail::Signal { sem, n } => self.dma.signal(sem, n),
            }
        }
        Ok(())
    }

    /// A wait at `op` that cannot end now (`e`, the deadlock it would be on one device): in an SPMD
    /// run, wait for another device's delivery and take it; on one device, the error.
    pub(super) fn wait_for_peers(&mut self, e: crate::error::KernelError, op: &Op) -> Result<()> {
        if e.kind != crate::error::ErrorKind::Deadlock {
            return Err(e);
        }
        let Some(link) = self.link.clone() else {
            return Err(e);
        };
        link.block(format!("{} (at {})", e.message, op.loc))?;
        self.receive()
    }
}
