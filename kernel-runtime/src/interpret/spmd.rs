//! Interpret mode over a mesh of devices ([`interpret_spmd`]): every device of the launch's mesh runs
//! the kernel on its own inputs, in a thread of its own, and the ops that talk across devices —
//! remote copies, remote signals, the barrier semaphore — meet the other devices here.
//!
//! **One device runs at a time**, and the order is fixed: device 0 runs until it waits for something
//! that has not come (a receive, a signal), then the next device that can run (in device order after
//! it) takes over, and so on. A device that waits becomes runnable again when a copy or signal is
//! delivered to it. So a run's verdicts and numbers never depend on thread timing, and a kernel's
//! wait that nothing will end is found: when every unfinished device waits, the run is a `Deadlock`
//! error naming each device's wait and its line.
//!
//! A copy's data leaves the sender at its start (a snapshot of its source: writing the source before
//! `wait_send` is a race either way) and is delivered to the receiver, whose DMA model counts it as a
//! copy in flight into its destination until a wait on the receive semaphore shows it complete —
//! reading the destination before then is a race, as for a local copy. Faults across devices are
//! errors at the user's line naming the devices: a device id outside the mesh, a copy or signal to a
//! device that has already finished the kernel (nothing waits for it there), a receive never waited
//! for, the barrier semaphore left signalled at the kernel's end (the next kernel of the collective
//! would see it).

use super::machine::{RefView, Sem};
use super::tensor::Tensor;
use super::{HostArray, InterpretOptions};
use crate::error::{kerr, KernelError, Result, SourceLoc};
use crate::ir::Kernel;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// What one device sends another.
pub(crate) enum Mail {
    /// A remote copy's data, for `dst` on the receiver, counted on its semaphore `sem`.
    Copy(Box<Delivery>),
    /// `n` added to semaphore `sem` of the receiver.
    Signal { sem: Sem, n: i64 },
}

/// A remote copy as it reaches the receiver.
pub(crate) struct Delivery {
    pub from: usize,
    pub src: RefView,
    pub dst: RefView,
    pub data: Tensor,
    pub sem: Sem,
    pub loc: SourceLoc,
}

#[derive(Clone, Debug, PartialEq)]
enum Status {
    /// Not started, or woken by a delivery: may run.
    Ready,
    Running,
    /// Waiting; the text is the wait that would never return if nothing came, at its line.
    Blocked(String),
    Done,
}

struct State {
    running: Option<usize>,
    /// Which devices have joined (a device's thread is XLA's in an FFI run: it may come late).
    joined: Vec<bool>,
    status: Vec<Status>,
    inbox: Vec<Vec<Mail>>,
    /// Set when no device can run: the deadlock every waiting device reports.
    deadlock: Option<String>,
    /// A device stopped with an error of its own: the others' deadlock follows from it.
    failed: Option<usize>,
    next_tag: u64,
}

/// The devices of one launch and what passes between them.
pub(crate) struct Fabric {
    join: std::time::Duration,
    mesh: crate::mesh::Mesh,
    state: Mutex<State>,
    turn: Condvar,
    pending: Vec<AtomicBool>,
}

/// One device's handle on its launch's fabric.
pub(crate) struct Link {
    pub me: usize,
    fabric: Arc<Fabric>,
}

thread_local! {
    static LINK: RefCell<Option<Arc<Link>>> = const { RefCell::new(None) };
}

/// The device this thread runs, in an SPMD run.
pub(crate) fn current() -> Option<Arc<Link>> {
    LINK.with(|l| l.borrow().clone())
}

/// How long a device waits for the others of its launch to join before giving up (an XLA that runs
/// fewer device programs at once than the mesh has devices would otherwise hang): 120 s, or
/// `TPU_KERNEL_SPMD_JOIN_SECONDS`.
fn join_timeout() -> std::time::Duration {
    let secs = std::env::var("TPU_KERNEL_SPMD_JOIN_SECONDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(120);
    std::time::Duration::from_secs(secs)
}

impl Fabric {
    /// The fabric of one launch over `mesh`: device 0 runs first.
    pub fn new(mesh: crate::mesh::Mesh) -> Arc<Fabric> {
        Fabric::with_join_timeout(mesh, join_timeout())
    }

    fn with_join_timeout(mesh: crate::mesh::Mesh, join: std::time::Duration) -> Arc<Fabric> {
        let n = mesh.devices();
        Arc::new(Fabric {
            join,
            mesh,
            state: Mutex::new(State {
                running: Some(0),
                joined: vec![false; n],
                status: vec![Status::Ready; n],
                inbox: (0..n).map(|_| Vec::new()).collect(),
                deadlock: None,
                failed: None,
                next_tag: 0,
            }),
            turn: Condvar::new(),
            pending: (0..n).map(|_| AtomicBool::new(false)).collect(),
        })
    }

    /// Whether device `d` has joined this launch.
    pub fn joined(&self, d: usize) -> bool {
        self.lock().joined[d]
    }

    /// Every device has finished.
    pub fn finished(&self) -> bool {
        self.lock().status.iter().all(|s| *s == Status::Done)
    }

    /// The device that stopped first on an error, if any.
    fn first_failure(&self) -> Option<usize> {
        self.lock().failed
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hand the turn to the next device that can run after `me`; with none, every unfinished device
    /// waits: a deadlock.
    fn pass(&self, st: &mut State, me: usize) {
        let n = st.status.len();
        st.running = (1..=n)
            .map(|k| (me + k) % n)
            .find(|&d| st.status[d] == Status::Ready);
        if st.running.is_none() && st.status.iter().any(|s| matches!(s, Status::Blocked(_))) {
            let waits: Vec<String> = st
                .status
                .iter()
                .enumerate()
                .filter_map(|(d, s)| match s {
                    Status::Blocked(w) => Some(format!("device {d} {w}")),
                    _ => None,
                })
                .collect();
            st.deadlock = Some(match st.failed {
                Some(f) => format!("device {f} stopped with an error, and {}", waits.join("; ")),
                None => format!(
                    "every device of the mesh {} waits: {}",
                    self.mesh.describe(),
                    waits.join("; ")
                ),
            });
        }
        self.turn.notify_all();
    }
}

impl Link {
    fn wait_turn<'a>(&'a self, mut st: MutexGuard<'a, State>) -> Result<MutexGuard<'a, State>> {
        loop {
            if st.running == Some(self.me) {
                st.status[self.me] = Status::Running;
                return Ok(st);
            }
            if let Some(d) = &st.deadlock {
                return Err(kerr!(Deadlock, "{d}"));
            }
            // The device whose turn it is has not joined yet: wait for it, but not forever.
            let late = st.running.filter(|&d| !st.joined[d]);
            let (next, timeout) = self
                .fabric
                .turn
                .wait_timeout(st, self.fabric.join)
                .unwrap_or_else(|p| p.into_inner());
            st = next;
            if let Some(d) = late.filter(|&d| timeout.timed_out() && !st.joined[d]) {
                let msg = format!(
                    "device {d} of the mesh {} never reached the kernel within {} s: the devices of a launch that talks across devices run together, so XLA must run every device's program at once (a CPU mesh of at most as many devices as XLA runs in parallel)",
                    self.fabric.mesh.describe(),
                    self.fabric.join.as_secs()
                );
                st.deadlock = Some(msg.clone());
                self.fabric.turn.notify_all();
                return Err(kerr!(Deadlock, "{msg}"));
            }
        }
    }

    /// The mesh of the launch.
    pub fn mesh(&self) -> &crate::mesh::Mesh {
        &self.fabric.mesh
    }

    /// A delivery waits in this device's inbox.
    pub fn has_mail(&self) -> bool {
        self.fabric.pending[self.me].load(Ordering::Acquire)
    }

    /// Take this device's deliveries, oldest first.
    pub fn take_mail(&self) -> Vec<Mail> {
        let mut st = self.fabric.lock();
        self.fabric.pending[self.me].store(false, Ordering::Release);
        std::mem::take(&mut st.inbox[self.me])
    }

    /// A fresh handle for a received copy's data.
    pub fn tag(&self) -> u64 {
        let mut st = self.fabric.lock();
        st.next_tag += 1;
        st.next_tag
    }

    /// Deliver `mail` to device `to` (which may run again if it waits). A device that has finished
    /// the kernel waits for nothing more: an error.
    pub fn send(&self, to: usize, mail: Mail, what: &str) -> Result<()> {
        let mut st = self.fabric.lock();
        if st.status[to] == Status::Done {
            return Err(kerr!(
                Race,
                "device {} sends {what} to device {to}, which has already finished the kernel: nothing there waits for it",
                self.me
            ));
        }
        st.inbox[to].push(mail);
        self.fabric.pending[to].store(true, Ordering::Release);
        if matches!(st.status[to], Status::Blocked(_)) {
            st.status[to] = Status::Ready;
        }
        Ok(())
    }

    /// Wait (`what`: the wait, at its line, as the deadlock would name it) until a delivery comes and
    /// this device runs again; an error when every device waits.
    pub fn block(&self, what: String) -> Result<()> {
        let mut st = self.fabric.lock();
        if self.has_mail() {
            return Ok(());
        }
        st.status[self.me] = Status::Blocked(what);
        self.fabric.pass(&mut st, self.me);
        self.wait_turn(st).map(|_| ())
    }

    fn finish(&self, failed: bool) {
        let mut st = self.fabric.lock();
        st.status[self.me] = Status::Done;
        if failed && st.failed.is_none() {
            st.failed = Some(self.me);
        }
        self.fabric.pass(&mut st, self.me);
    }
}

/// Run `f` on this thread as device `d` of `fabric`'s launch: it joins, waits for its turn, runs
/// (the ops across devices meet the others through the fabric), and finishes — an error counts as
/// the device stopping on it.
pub(crate) fn run_device<R>(
    fabric: &Arc<Fabric>,
    d: usize,
    f: impl FnOnce() -> Result<R>,
) -> Result<R> {
    let link = Arc::new(Link {
        me: d,
        fabric: Arc::clone(fabric),
    });
    {
        let mut st = fabric.lock();
        st.joined[d] = true;
        fabric.turn.notify_all();
    }
    let previous = LINK.with(|l| l.borrow_mut().replace(Arc::clone(&link)));
    let r = link.wait_turn(fabric.lock()).map(drop).and_then(|_| f());
    link.finish(r.is_err());
    LINK.with(|l| *l.borrow_mut() = previous);
    r
}

/// An error of device `d` of `mesh`, named after it.
pub(crate) fn on_device(mesh: &crate::mesh::Mesh, d: usize, e: KernelError) -> KernelError {
    KernelError {
        message: format!(
            "on device {d} {:?} of the mesh {}: {}",
            mesh.coords(d),
            mesh.describe(),
            e.message
        ),
        ..e
    }
}

/// Run `kernel` on every device of `mesh`, device `d` (numbered row-major over the mesh axes) on
/// `inputs[d]`; returns each device's outputs. A kernel built for a mesh (one that talks across
/// devices) runs on that mesh only; one built for none runs on each device alone. The error returned
/// is the first device's to stop on one, named after it (the others' deadlocks follow from it).
pub fn interpret_spmd(
    kernel: &Kernel,
    mesh: &crate::mesh::Mesh,
    inputs: &[Vec<HostArray>],
    options: &InterpretOptions,
) -> Result<Vec<Vec<HostArray>>> {
    match &kernel.mesh {
        Some(built) if built != mesh => {
            return Err(kerr!(
                Grid,
                "the kernel was built for the mesh {} and is run on the mesh {}: build it for the mesh it runs on (`.mesh(..)` or `Mesh::scope`)",
                built.describe(),
                mesh.describe()
            ))
        }
        None if kernel.communicates() => {
            return Err(kerr!(
                Grid,
                "a kernel that talks across devices without a mesh (internal error)"
            ))
        }
        _ => {}
    }
    let mesh = mesh.clone();
    let n = mesh.devices();
    if inputs.len() != n {
        return Err(kerr!(
            Shape,
            "the mesh {} has {n} devices but inputs were given for {}: one list of inputs per device",
            mesh.describe(),
            inputs.len()
        ));
    }
    let fabric = Fabric::new(mesh.clone());
    // One machine per device: no grid chunks on other threads.
    let opts = InterpretOptions {
        parallel: false,
        ..options.clone()
    };
    let results: Vec<Result<Vec<HostArray>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|d| {
                let (opts, inputs, fabric) = (&opts, &inputs[d], &fabric);
                s.spawn(move || run_device(fabric, d, || super::grid::run(kernel, inputs, opts)))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(kerr!(
                        Internal,
                        "a device's interpreter thread panicked (a bug in tpu-kernel; please report it)"
                    ))
                })
            })
            .collect()
    });
    let first = fabric.first_failure();
    if let Some(d) = first.or_else(|| results.iter().position(Result::is_err)) {
        if let Some(Err(e)) = results.get(d) {
            return Err(on_device(&mesh, d, e.clone()));
        }
    }
    Ok(results.into_iter().map(|r| r.unwrap_or_default()).collect())
}

/// One launch of a kernel that talks across devices, run by XLA's device threads (each device's
/// FFI call joins it): XLA's run id and the call's request say which launch a call belongs to.
struct Launch {
    run_id: i64,
    request: String,
    fabric: Arc<Fabric>,
}

static LAUNCHES: Mutex<Vec<Launch>> = Mutex::new(Vec::new());

/// Which launch an FFI call is part of, and which device of its mesh it runs.
pub(crate) struct LaunchKey<'a> {
    pub run_id: i64,
    pub request: &'a str,
    pub device: usize,
}

/// [`super::interpret_into`] as device `key.device` of a launch the other devices' calls join
/// (the first call to arrive opens it; a device's next call with the same run id and request joins
/// the next launch). The error returned is named after the device.
pub(crate) fn interpret_into_launch(
    kernel: &Kernel,
    inputs: &[super::ArrayView<'_>],
    outputs: &mut [super::ArrayViewMut<'_>],
    options: &InterpretOptions,
    key: LaunchKey<'_>,
) -> Result<()> {
    let mesh = kernel
        .mesh
        .clone()
        .ok_or_else(|| kerr!(Grid, "a kernel that talks across devices without a mesh"))?;
    let d = key.device;
    let fabric = {
        let mut all = LAUNCHES.lock().unwrap_or_else(|p| p.into_inner());
        let open = all
            .iter()
            .find(|l| l.run_id == key.run_id && l.request == key.request && !l.fabric.joined(d));
        match open {
            Some(l) => Arc::clone(&l.fabric),
            None => {
                let fabric = Fabric::new(mesh.clone());
                all.push(Launch {
                    run_id: key.run_id,
                    request: key.request.to_string(),
                    fabric: Arc::clone(&fabric),
                });
                fabric
            }
        }
    };
    let opts = InterpretOptions {
        parallel: false,
        ..options.clone()
    };
    let r = run_device(&fabric, d, || {
        super::grid::run_into(kernel, inputs, outputs, &opts, None)
    });
    LAUNCHES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|l| !(Arc::ptr_eq(&l.fabric, &fabric) && fabric.finished()));
    r.map_err(|e| on_device(&mesh, d, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_that_never_joins_is_an_error_naming_it_not_a_hang() {
        let mesh = crate::mesh::Mesh::new([("x", 2)]).unwrap();
        let fabric = Fabric::with_join_timeout(mesh, std::time::Duration::from_millis(200));
        // Device 1 joins; device 0, whose turn comes first, never does.
        let e = run_device(&fabric, 1, || Ok(())).unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::Deadlock, "{e}");
        assert!(
            e.message
                .contains("device 0 of the mesh {x: 2} never reached the kernel"),
            "{e}"
        );
    }
}
