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

impl Fabric {
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
            st = self.fabric.turn.wait(st).unwrap_or_else(|p| p.into_inner());
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

/// Run `kernel` on every device of its mesh, device `d` on `inputs[d]`; returns each device's
/// outputs. The kernel's mesh gives the devices; the first error (by device) is returned, named
/// after its device — a deadlock only when no device failed on its own.
pub fn interpret_spmd(
    kernel: &Kernel,
    inputs: &[Vec<HostArray>],
    options: &InterpretOptions,
) -> Result<Vec<Vec<HostArray>>> {
    let mesh = kernel.mesh.clone().ok_or_else(|| {
        kerr!(
            Grid,
            "interpret_spmd runs a kernel on every device of its mesh, and this launch has none: give it one with `.mesh(Mesh::new([(\"x\", 4)])?)`"
        )
    })?;
    let n = mesh.devices();
    if inputs.len() != n {
        return Err(kerr!(
            Shape,
            "the mesh {} has {n} devices but inputs were given for {}: one list of inputs per device",
            mesh.describe(),
            inputs.len()
        ));
    }
    let fabric = Arc::new(Fabric {
        mesh: mesh.clone(),
        state: Mutex::new(State {
            running: Some(0),
            status: vec![Status::Ready; n],
            inbox: (0..n).map(|_| Vec::new()).collect(),
            deadlock: None,
            failed: None,
            next_tag: 0,
        }),
        turn: Condvar::new(),
        pending: (0..n).map(|_| AtomicBool::new(false)).collect(),
    });
    // One machine per device: no grid chunks on other threads.
    let opts = InterpretOptions {
        parallel: false,
        ..options.clone()
    };
    let results: Vec<Result<Vec<HostArray>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|d| {
                let link = Arc::new(Link {
                    me: d,
                    fabric: Arc::clone(&fabric),
                });
                let (opts, inputs) = (&opts, &inputs[d]);
                s.spawn(move || {
                    LINK.with(|l| *l.borrow_mut() = Some(Arc::clone(&link)));
                    let r = link
                        .wait_turn(link.fabric.lock())
                        .map(drop)
                        .and_then(|_| super::grid::run(kernel, inputs, opts));
                    link.finish(r.is_err());
                    LINK.with(|l| l.borrow_mut().take());
                    r
                })
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
    let named = |d: usize, e: KernelError| KernelError {
        message: format!(
            "on device {d} {:?} of the mesh {}: {}",
            mesh.coords(d),
            mesh.describe(),
            e.message
        ),
        ..e
    };
    // The first device to stop on an error (a fault of its own, or the first to see the deadlock):
    // the others' deadlocks follow from it.
    let first = fabric.lock().failed;
    if let Some(d) = first.or_else(|| results.iter().position(Result::is_err)) {
        if let Some(Err(e)) = results.get(d) {
            return Err(named(d, e.clone()));
        }
    }
    Ok(results.into_iter().map(|r| r.unwrap_or_default()).collect())
}
