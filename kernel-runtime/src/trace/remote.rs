//! Talking to other devices of the mesh (Pallas's `lax.axis_index`, `lax.axis_size`,
//! `pltpu.make_async_remote_copy`, `pl.semaphore_signal(.., device_id=..)`,
//! `pltpu.get_barrier_semaphore`): a kernel run per shard inside `jax.shard_map` copies into the same
//! ref of a neighbour and signals its semaphores, addressed by device id.
//!
//! ```ignore
//! let me = axis_index("x");
//! let right = (me + 1) % axis_size("x");
//! let copy = async_remote_copy(buf.at(slot), buf.at(next), send_sem, recv_sem, [right]);
//! copy.start();
//! copy.wait_send();   // `buf.at(slot)` may be written again
//! copy.wait_recv();   // the left neighbour's copy into `buf.at(next)` here has landed
//! ```
//!
//! Device ids follow the launch's mesh (`.mesh(..)` on the builder, or the `jax.shard_map` mesh the
//! JAX op is called in): mesh coordinates, one per axis (`[x, y]`, or `DeviceId::along("y", j)` for
//! the device at `j` along one axis and at this device's coordinates on the others), or a logical id
//! (`DeviceId::logical(k)`: the device's number, row-major over the mesh axes).

use super::array::{IntoArg, Scalar};
use super::dma::{one_semaphore, DmaSem, DmaSource, DmaTarget, Endpoint, Sem};
use super::refs::view_in;
use super::{emit, with, Arg, Tracer};
use crate::dtype::DType;
use crate::error::{kerr, Result, SourceLoc};
use crate::ir::{BinaryOp, MemSpace, OpKind, SemKind, Type, ValueId};
use crate::mesh::Mesh;

const I32: Type = Type::Scalar(DType::I32);

/// The mesh of the running trace, or an error saying how to give one.
fn mesh(t: &Tracer, what: &str) -> Result<Mesh> {
    t.mesh.clone().ok_or_else(|| {
        kerr!(
            Grid,
            "{what} needs the device mesh the kernel runs over: call the JAX op inside `jax.shard_map`, or give the launch one with `.mesh(Mesh::new([(\"x\", 4)])?)`"
        )
    })
}

/// `a op b` on i32 scalars, inside a running trace.
fn arith(t: &mut Tracer, op: BinaryOp, a: ValueId, b: i64, loc: SourceLoc) -> Result<ValueId> {
    let b = t.materialize(
        Arg::Lit(crate::dtype::Literal::from_i64(DType::I32, b)),
        &I32,
        loc,
    )?;
    let v = t.push1(OpKind::Binary(op), vec![a, b], I32, loc);
    t.check(v)
}

/// This device's index along `axis`.
fn axis_index_in(t: &mut Tracer, m: &Mesh, axis: &str, loc: SourceLoc) -> Result<ValueId> {
    let (_, size, stride) = m.axis(axis)?;
    let kind = OpKind::AxisIndex {
        stride: stride as u32,
        size: size as u32,
    };
    let v = t.push1(kind, vec![], I32, loc);
    t.check(v)
}

/// This device's index along mesh axis `axis` (`jax.lax.axis_index("x")`), in `0..axis_size(axis)`.
#[track_caller]
pub fn axis_index(axis: impl AsRef<str>) -> Scalar<i32> {
    let loc = SourceLoc::caller();
    let axis = axis.as_ref();
    Scalar::from_val(emit(loc, |t| {
        let m = mesh(t, &format!("axis_index({axis:?})"))?;
        let id = axis_index_in(t, &m, axis, loc)?;
        Ok(t.val(id))
    }))
}

/// The number of devices along mesh axis `axis` (`jax.lax.axis_size("x")`): a compile-time value.
#[track_caller]
pub fn axis_size(axis: impl AsRef<str>) -> i32 {
    let axis = axis.as_ref();
    with(SourceLoc::caller(), |t| {
        let m = mesh(t, &format!("axis_size({axis:?})"))?;
        Ok(m.axis(axis)?.1 as i32)
    })
    .unwrap_or(1)
}

/// Which device a remote copy or signal goes to (see the module docs).
#[derive(Clone, Debug)]
pub struct DeviceId(Id);

#[derive(Clone, Debug)]
enum Id {
    Logical(Arg),
    Coords(Vec<Arg>),
    Along(String, Arg),
}

impl DeviceId {
    /// The device numbered `id`, row-major over the mesh axes (Pallas's `DeviceIdType.LOGICAL`).
    pub fn logical(id: impl IntoArg<i32>) -> DeviceId {
        DeviceId(Id::Logical(id.into_arg()))
    }
    /// The device at these mesh coordinates, one per axis, major to minor.
    pub fn mesh<const N: usize>(coords: [Scalar<i32>; N]) -> DeviceId {
        DeviceId(Id::Coords(coords.iter().map(|c| Arg::Val(c.v)).collect()))
    }
    /// The device at `index` along `axis`, at this device's coordinates on every other axis (Pallas's
    /// `device_id={"y": j}`).
    pub fn along(axis: impl AsRef<str>, index: impl IntoArg<i32>) -> DeviceId {
        DeviceId(Id::Along(axis.as_ref().to_string(), index.into_arg()))
    }

    /// The logical id as an i32 value of the running trace.
    fn resolve(&self, t: &mut Tracer, loc: SourceLoc) -> Result<ValueId> {
        let scalar = |t: &mut Tracer, a: Arg| -> Result<ValueId> {
            if let Arg::Val(v) = a {
                if !matches!(t.ty(v)?, Type::Scalar(DType::I32)) {
                    return Err(kerr!(
                        DType,
                        "a device id or mesh coordinate is an i32 scalar, not a {}",
                        t.ty(v)?
                    ));
                }
            }
            t.materialize(a, &I32, loc)
        };
        let m = mesh(t, "a device id")?;
        let coords: Vec<Option<Arg>> = match &self.0 {
            Id::Logical(a) => return scalar(t, *a),
            Id::Coords(c) => {
                if c.len() != m.axes().len() {
                    return Err(kerr!(
                        Shape,
                        "a device id of {} mesh coordinates, but the mesh {} has {} axes: give one per axis, or `DeviceId::along(axis, index)` for one axis",
                        c.len(),
                        m.describe(),
                        m.axes().len()
                    ));
                }
                c.iter().map(|a| Some(*a)).collect()
            }
            Id::Along(axis, a) => {
                let (pos, _, _) = m.axis(axis)?;
                (0..m.axes().len())
                    .map(|i| (i == pos).then_some(*a))
                    .collect()
            }
        };
        // Σ coordinate × stride, from the major axis down (as Pallas linearizes mesh ids).
        let strides = m.strides();
        let mut acc: Option<ValueId> = None;
        for (i, c) in coords.into_iter().enumerate() {
            let c = match c {
                Some(a) => scalar(t, a)?,
                None => axis_index_in(t, &m, &m.axes()[i].0.clone(), loc)?,
            };
            let term = if strides[i] == 1 {
                c
            } else {
                arith(t, BinaryOp::Mul, c, strides[i] as i64, loc)?
            };
            acc = Some(match acc {
                None => term,
                Some(a) => {
                    let v = t.push1(OpKind::Binary(BinaryOp::Add), vec![a, term], I32, loc);
                    t.check(v)?
                }
            });
        }
        acc.ok_or_else(|| kerr!(Grid, "a mesh without axes"))
    }
}

/// What names a device: a [`DeviceId`], a logical id (`Scalar<i32>`, `i32`), or mesh coordinates
/// (`[x, y]` of `Scalar<i32>`, or a tuple mixing scalars and integers).
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not name a device",
    note = "give mesh coordinates (`[x, y]`, one per mesh axis), `DeviceId::along(\"x\", i)`, or a logical id (`DeviceId::logical(k)`)"
)]
pub trait IntoDeviceId {
    fn into_device_id(self) -> DeviceId;
}
impl IntoDeviceId for DeviceId {
    fn into_device_id(self) -> DeviceId {
        self
    }
}
impl IntoDeviceId for Scalar<i32> {
    fn into_device_id(self) -> DeviceId {
        DeviceId::logical(self)
    }
}
impl IntoDeviceId for i32 {
    fn into_device_id(self) -> DeviceId {
        DeviceId::logical(self)
    }
}
impl<const N: usize> IntoDeviceId for [Scalar<i32>; N] {
    fn into_device_id(self) -> DeviceId {
        DeviceId::mesh(self)
    }
}
macro_rules! tuple_device_id {
    ($($n:ident),+) => {
        impl<$($n: IntoArg<i32>),+> IntoDeviceId for ($($n,)+) {
            #[allow(non_snake_case)]
            fn into_device_id(self) -> DeviceId {
                let ($($n,)+) = self;
                DeviceId(Id::Coords(vec![$($n.into_arg()),+]))
            }
        }
    };
}
tuple_device_id!(A);
tuple_device_id!(A, B);
tuple_device_id!(A, B, C);
tuple_device_id!(A, B, C, D);

/// A copy from a ref of this device into the same-shaped ref of another
/// (`pltpu.make_async_remote_copy`): [`start`](RemoteCopy::start) sends it; the send semaphore
/// counts its bytes as they leave ([`wait_send`](RemoteCopy::wait_send): the source may be written
/// again), the destination device's receive semaphore as they land there
/// ([`wait_recv`](RemoteCopy::wait_recv), run by the receiver: its destination may be read).
#[derive(Clone, Debug)]
pub struct RemoteCopy {
    src: Endpoint,
    dst: Endpoint,
    send: DmaSem,
    recv: DmaSem,
    device: DeviceId,
}

/// Describe a copy of `src` into `dst` on device `device` (see [`RemoteCopy`]).
pub fn async_remote_copy<T>(
    src: impl DmaSource<T>,
    dst: impl DmaTarget<T>,
    send_sem: DmaSem,
    recv_sem: DmaSem,
    device: impl IntoDeviceId,
) -> RemoteCopy {
    RemoteCopy {
        src: src.endpoint(),
        dst: dst.endpoint(),
        send: send_sem,
        recv: recv_sem,
        device: device.into_device_id(),
    }
}

impl RemoteCopy {
    /// Send the copy (`tpu.enqueue_dma` with a device id).
    #[track_caller]
    pub fn start(&self) {
        self.issue(OpKind::RemoteDmaStart, SourceLoc::caller());
    }
    /// Wait until the copy has left this device: its source may be written again.
    #[track_caller]
    pub fn wait_send(&self) {
        self.issue(OpKind::RemoteDmaWait { recv: false }, SourceLoc::caller());
    }
    /// Wait until a copy of this shape into this device's destination has landed (sent by the
    /// device whose copy targets this one): its destination may be read.
    #[track_caller]
    pub fn wait_recv(&self) {
        self.issue(OpKind::RemoteDmaWait { recv: true }, SourceLoc::caller());
    }
    /// [`wait_send`](RemoteCopy::wait_send), then [`wait_recv`](RemoteCopy::wait_recv) (Pallas's
    /// `copy.wait()` of a remote copy).
    #[track_caller]
    pub fn wait(&self) {
        let loc = SourceLoc::caller();
        self.issue(OpKind::RemoteDmaWait { recv: false }, loc);
        self.issue(OpKind::RemoteDmaWait { recv: true }, loc);
    }

    fn issue(&self, kind: OpKind, loc: SourceLoc) {
        with(loc, |t| {
            let src = view_in(t, self.src.r, self.src.spec.as_ref(), loc)?;
            let dst = view_in(t, self.dst.r, self.dst.spec.as_ref(), loc)?;
            let send = one_semaphore(t, self.send.v, SemKind::Dma)?;
            let recv = one_semaphore(t, self.recv.v, SemKind::Dma)?;
            super::dma::same_window(t, src, dst)?;
            for (id, side) in [(src, "source"), (dst, "destination")] {
                if let Type::Ref(_, _, MemSpace::Smem) = t.ty_of(id) {
                    return Err(kerr!(
                        Unsupported,
                        "a remote copy's {side} is in SMEM: copy between VMEM or HBM (`Any`) refs"
                    ));
                }
            }
            let device = self.device.resolve(t, loc)?;
            t.push(
                kind,
                vec![src, dst, send, recv, device],
                vec![],
                vec![],
                loc,
            );
            Ok(())
        });
    }
}

impl Sem {
    /// Add `amount` to this semaphore on device `device` (`pl.semaphore_signal(sem, n,
    /// device_id=..)`): the other device's copy of the same semaphore scratch (or its barrier
    /// semaphore).
    #[track_caller]
    pub fn signal_on(self, amount: impl IntoArg<i32>, device: impl IntoDeviceId) {
        let loc = SourceLoc::caller();
        let (amount, device) = (amount.into_arg(), device.into_device_id());
        with(loc, |t| {
            let s = one_semaphore(t, self.v, SemKind::Regular)?;
            let n = t.materialize(amount, &I32, loc)?;
            let d = device.resolve(t, loc)?;
            t.push(OpKind::SemSignalRemote, vec![s, n, d], vec![], vec![], loc);
            Ok(())
        });
    }
}

/// The barrier semaphore (`pltpu.get_barrier_semaphore()`): a regular semaphore each device of the
/// collective has, for a handshake before the first remote copy (signal the neighbours with
/// [`Sem::signal_on`], then wait). The launch needs a collective id (`.collective_id(n)`): kernels
/// sharing one share the barrier, so each must leave it at zero.
#[track_caller]
pub fn barrier_semaphore() -> Sem {
    let loc = SourceLoc::caller();
    Sem {
        v: emit(loc, |t| {
            if t.collective_id.is_none() {
                return Err(kerr!(
                    Signature,
                    "barrier_semaphore() needs the launch's collective id: add `.collective_id(0)` to the pallas_call builder (kernels with one id share the barrier)"
                ));
            }
            mesh(t, "barrier_semaphore()")?;
            let ty = Type::Ref(vec![], DType::I32, MemSpace::Sem(SemKind::Regular));
            Ok(t.push1(OpKind::BarrierSemaphore, vec![], ty, loc))
        }),
    }
}
