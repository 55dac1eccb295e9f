//! DMA semaphores count bytes, as on TPU: the idioms real kernels use (one wait for several page
//! copies, two half waits for one copy) run; a wait nothing can satisfy is a deadlock; a read whose
//! copy may still be in flight — the wait may have been satisfied by another copy — is a race; a copy
//! or a count carried across a `parallel` grid step is a race whatever the run's threading. Both
//! engines where they can see the fault (Mosaic-on-CPU lands copies at their start: no races).
//!
//! Then a random-schedule check: a small reference model of byte-counted semaphores, written here
//! independently of `semantics::dma`, gives the verdict (ok, race, deadlock) of random schedules of
//! starts, waits, reads and writes over two semaphores, and the interpreter must give the same one,
//! with and without `parallel`, under several `dma_seed`s. `DMA_SCHEDULES=20000 cargo test --test
//! dma_bytes random` runs a longer check (default 2,000 schedules).

use tpu_kernel::prelude::*;
use tpu_kernel::runtime::mosaic_cpu;
use tpu_kernel::trace::Ds;
use tpu_kernel::{ErrorKind, KernelError};
use DimensionSemantics::{Arbitrary, Parallel};

const ROWS: usize = 32;

fn f32s(rows: usize) -> ArrayType {
    ArrayType::new([rows, 128], F32)
}

fn ramp(rows: usize) -> HostArray {
    HostArray::from_vec(
        [rows, 128],
        (0..rows * 128)
            .map(|i| i as f32 * 0.5 - 3.0)
            .collect::<Vec<_>>(),
    )
    .unwrap()
}

/// The verdict of a run: `None` for ok, else the error's kind.
fn verdict(r: &Result<Vec<HostArray>, KernelError>) -> Option<ErrorKind> {
    r.as_ref().err().map(|e| e.kind)
}

fn interpret(
    call: &PallasCall,
    x: &HostArray,
    parallel: bool,
    seed: Option<u64>,
) -> Result<Vec<HostArray>, KernelError> {
    let opts = InterpretOptions {
        parallel,
        dma_seed: seed,
        ..InterpretOptions::default()
    };
    call.interpret_with(std::slice::from_ref(x), &opts)
}

/// A one-step kernel over `x` in HBM (`ROWS` rows), an output block, and two VMEM buffers of `ROWS`
/// rows and two DMA semaphores as scratch.
fn one_step(
    kernel: impl Fn(Ref<f32, Any>, RefMut<f32>, RefMut<f32>, RefMut<f32>, DmaSem) + 'static,
) -> PallasCall {
    pallas_call(kernel)
        .input_any(f32s(ROWS))
        .output(f32s(ROWS), BlockSpec::new([ROWS, 128], |[]| (0, 0)))
        .scratch(Vmem::new([ROWS, 128], F32))
        .scratch(Vmem::new([ROWS, 128], F32))
        .scratch(DmaSem::array([2]))
        .build()
        .expect("build")
}

fn rows(start: usize, n: usize) -> (Ds, std::ops::RangeFull) {
    (ds(start as i32, n), ..)
}

// ---------------------------------------------------------------------------------------------- idioms

/// ragged paged attention's idiom: four 8-row page copies on one semaphore, one wait whose descriptor
/// covers the whole slot (32 rows: the pages' bytes).
#[test]
fn one_wait_for_several_page_copies_runs_in_both_engines() {
    let call = one_step(|x, o, a, _b, s| {
        for p in unroll(0..4) {
            async_copy(x.at(rows(8 * p, 8)), a.at(rows(8 * p, 8)), s.at(0)).start();
        }
        async_copy(x, a, s.at(0)).wait();
        o.store(a.load() * 2.0);
    });
    let x = ramp(ROWS);
    let want: Vec<f32> = x
        .as_slice::<f32>()
        .unwrap()
        .iter()
        .map(|v| v * 2.0)
        .collect();
    for parallel in [false, true] {
        let out = interpret(&call, &x, parallel, None).expect("interpret");
        assert_eq!(out[0].as_slice::<f32>().unwrap(), &want[..]);
    }
    let out = mosaic_cpu::run(call.ir(), std::slice::from_ref(&x)).expect("mosaic_cpu");
    assert_eq!(out[0].as_slice::<f32>().unwrap(), &want[..]);
}

/// One 16-row copy waited as two 8-row halves: fine once both are waited; between them the copy may
/// still be in flight (its bytes land in pieces), so reading any of its destination is a race.
#[test]
fn a_copy_waited_in_halves_is_complete_after_the_second_half_only() {
    let halves = one_step(|x, o, a, _b, s| {
        async_copy(x.at(rows(0, 16)), a.at(rows(0, 16)), s.at(1)).start();
        async_copy(x.at(rows(0, 8)), a.at(rows(0, 8)), s.at(1)).wait();
        async_copy(x.at(rows(8, 8)), a.at(rows(8, 8)), s.at(1)).wait();
        o.at(rows(0, 16)).store(a.at(rows(0, 16)).load());
        o.at(rows(16, 16)).store(full([16, 128], 0.0f32));
    });
    let x = ramp(ROWS);
    let out = interpret(&halves, &x, true, None).expect("interpret");
    assert_eq!(
        &out[0].as_slice::<f32>().unwrap()[..16 * 128],
        &x.as_slice::<f32>().unwrap()[..16 * 128]
    );
    let mosaic = mosaic_cpu::run(halves.ir(), std::slice::from_ref(&x)).expect("mosaic_cpu");
    assert_eq!(mosaic[0].as_slice::<f32>(), out[0].as_slice::<f32>());

    let early = one_step(|x, o, a, _b, s| {
        async_copy(x.at(rows(0, 16)), a.at(rows(0, 16)), s.at(1)).start();
        async_copy(x.at(rows(0, 8)), a.at(rows(0, 8)), s.at(1)).wait();
        o.at(rows(0, 8)).store(a.at(rows(0, 8)).load());
        async_copy(x.at(rows(8, 8)), a.at(rows(8, 8)), s.at(1)).wait();
        o.at(rows(8, 24)).store(full([24, 128], 0.0f32));
    });
    for seed in [None, Some(1), Some(2)] {
        let e = interpret(&early, &x, true, seed).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Race, "{e}");
        assert!(e.message.contains("reads scratch 0[0..8, 0..128]"), "{e}");
    }
}

/// One 8-row copy waited with a 16-row descriptor hangs on a TPU: a deadlock in both engines, with
/// one message.
#[test]
fn a_wait_for_more_bytes_than_started_is_a_deadlock_in_both_engines() {
    let call = one_step(|x, o, a, _b, s| {
        async_copy(x.at(rows(0, 8)), a.at(rows(0, 8)), s.at(0)).start();
        async_copy(x.at(rows(0, 16)), a.at(rows(0, 16)), s.at(0)).wait();
        o.store(a.load());
    });
    let x = ramp(ROWS);
    let ours = interpret(&call, &x, true, None).unwrap_err();
    let theirs = mosaic_cpu::run(call.ir(), std::slice::from_ref(&x)).unwrap_err();
    for e in [&ours, &theirs] {
        assert_eq!(e.kind, ErrorKind::Deadlock, "{e}");
        assert!(
            e.message.contains(
                "waits for 8192 bytes on DMA semaphore scratch 2[0], but the copies started on it bring only 4096 more"
            ),
            "{e}"
        );
    }
    assert_eq!(ours.message, theirs.message);
    assert_eq!(ours.location, theirs.location);
}

/// Two copies on one semaphore, one wait of one copy's size, then a read of the older copy's
/// destination: on TPU the wait may have been satisfied by the younger copy — a race, whichever order
/// the copies were started in.
#[test]
fn a_wait_does_not_say_which_copy_it_retired() {
    for older_first in [true, false] {
        let call = one_step(move |x, o, a, b, s| {
            let ca = async_copy(x.at(rows(0, 8)), a.at(rows(0, 8)), s.at(0));
            let cb = async_copy(x.at(rows(8, 8)), b.at(rows(0, 8)), s.at(0));
            if older_first {
                ca.start();
                cb.start();
            } else {
                cb.start();
                ca.start();
            }
            ca.wait();
            o.at(rows(0, 8)).store(a.at(rows(0, 8)).load());
            cb.wait();
            o.at(rows(8, 24)).store(full([24, 128], 0.0f32));
        });
        let e = interpret(&call, &ramp(ROWS), false, None).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Race, "{e}");
        assert!(e.message.contains("reads scratch 0[0..8, 0..128]"), "{e}");
    }
}

#[tpu_kernel]
fn prefetch_kernel(x: Ref<f32, Any>, o: RefMut<f32>, buf: RefMut<f32>, s: DmaSem) {
    let i = program_id(0);
    if i == 0 {
        async_copy(
            x.at((ds(i * 8, 8), ..)),
            buf.at((i % 2, .., ..)),
            s.at(i % 2),
        )
        .start();
    }
    if i < 3 {
        let j = i + 1;
        async_copy(
            x.at((ds(j * 8, 8), ..)),
            buf.at((j % 2, .., ..)),
            s.at(j % 2),
        )
        .start();
    }
    async_copy(
        x.at((ds(i * 8, 8), ..)),
        buf.at((i % 2, .., ..)),
        s.at(i % 2),
    )
    .wait();
    o.store(buf.at((i % 2, .., ..)).load());
}

/// A cross-step prefetch (step i starts the copy step i + 1 waits for) on a `parallel` axis: the next
/// step may run on another core, so it is a race — with and without threads, and in Mosaic-on-CPU
/// too; on an `arbitrary` axis it is the double-buffering idiom and runs.
#[test]
fn a_copy_carried_across_a_parallel_step_is_a_race_whatever_the_threading() {
    let build = |semantics: DimensionSemantics| {
        pallas_call(prefetch_kernel)
            .grid([4])
            .dimension_semantics([semantics])
            .input_any(f32s(ROWS))
            .output(f32s(ROWS), BlockSpec::new([8, 128], |[i]| (i, 0)))
            .scratch(Vmem::new([2, 8, 128], F32))
            .scratch(DmaSem::array([2]))
            .build()
            .expect("build")
    };
    let x = ramp(ROWS);
    let fine = build(Arbitrary);
    for parallel in [false, true] {
        let out = interpret(&fine, &x, parallel, None).expect("arbitrary");
        assert_eq!(out[0].as_slice::<f32>(), x.as_slice::<f32>());
    }
    let racy = build(Parallel);
    for parallel in [false, true] {
        let e = interpret(&racy, &x, parallel, None).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Race, "parallel {parallel}: {e}");
        assert!(
            e.message.contains("at the end of grid step [0]")
                && e.message.contains("parallel axis 0"),
            "parallel {parallel}: {e}"
        );
    }
    let e = mosaic_cpu::run(racy.ir(), std::slice::from_ref(&x)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Race, "{e}");
    assert!(e.message.contains("at the end of grid step [0]"), "{e}");
}

// ---------------------------------------------------------------------------------------------- random

/// A window of `ROWS`-row buffer: rows `start..start + n`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Win {
    buf: usize,
    start: usize,
    n: usize,
}

impl Win {
    fn overlaps(&self, o: &Win) -> bool {
        self.buf == o.buf && self.start < o.start + o.n && o.start < self.start + self.n
    }
    fn bytes(&self) -> i64 {
        (self.n * 128 * 4) as i64
    }
}

/// Buffers: 0 = `x` in HBM (read only), 1 = `a`, 2 = `b`.
#[derive(Clone, Copy, Debug)]
enum Act {
    /// Start copy `k` of the schedule's copies.
    Start(usize),
    /// Wait on semaphore `sem` for `n` rows' bytes.
    Wait {
        sem: usize,
        n: usize,
    },
    Read(Win),
    Write(Win),
}

#[derive(Clone, Debug)]
struct Schedule {
    /// (source, destination, semaphore) of each copy.
    copies: Vec<(Win, Win, usize)>,
    acts: Vec<Act>,
}

/// The reference model: byte-counted semaphores, copies outstanding until the waits on their
/// semaphore have taken every byte of every copy outstanding on it.
fn model(s: &Schedule) -> Option<ErrorKind> {
    let mut out: Vec<(Win, Win, usize, i64)> = Vec::new();
    let mut value = [0i64; 2];
    let mut credit = [0i64; 2];
    let race = |out: &[(Win, Win, usize, i64)], w: &Win, write: bool| {
        out.iter()
            .any(|(src, dst, _, _)| dst.overlaps(w) || (write && src.overlaps(w)))
    };
    for act in &s.acts {
        match *act {
            Act::Start(k) => {
                let (src, dst, sem) = s.copies[k];
                if race(&out, &src, false) || race(&out, &dst, true) {
                    return Some(ErrorKind::Race);
                }
                value[sem] += dst.bytes();
                out.push((src, dst, sem, dst.bytes()));
            }
            Act::Wait { sem, n } => {
                let bytes = (n * 128 * 4) as i64;
                if value[sem] < bytes {
                    return Some(ErrorKind::Deadlock);
                }
                value[sem] -= bytes;
                credit[sem] += bytes;
                let owed: i64 = out.iter().filter(|c| c.2 == sem).map(|c| c.3).sum();
                if credit[sem] >= owed {
                    credit[sem] -= owed;
                    out.retain(|c| c.2 != sem);
                }
            }
            Act::Read(w) => {
                if race(&out, &w, false) {
                    return Some(ErrorKind::Race);
                }
            }
            Act::Write(w) => {
                if race(&out, &w, true) {
                    return Some(ErrorKind::Race);
                }
            }
        }
    }
    (!out.is_empty() || value.iter().any(|v| *v != 0)).then_some(ErrorKind::Race)
}

/// xorshift64*.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn random_window(r: &mut Rng, buf: usize) -> Win {
    let n = [8, 16][r.below(2)];
    let start = 8 * r.below((ROWS - n) / 8 + 1);
    Win { buf, start, n }
}

/// A random schedule: up to 4 copies (from `x` or `a`, into `a` or `b`, never within one buffer) on 2
/// semaphores, each started once, and waits biased to sizes that can be satisfied, reads and writes of
/// `a` and `b` between them.
fn random_schedule(r: &mut Rng) -> Schedule {
    let ncopies = 1 + r.below(4);
    let copies: Vec<(Win, Win, usize)> = (0..ncopies)
        .map(|_| {
            let dst_buf = 1 + r.below(2);
            let src_buf = if dst_buf == 2 && r.below(2) == 0 {
                1
            } else {
                0
            };
            let src = random_window(r, src_buf);
            let dst = Win {
                buf: dst_buf,
                start: 8 * r.below((ROWS - src.n) / 8 + 1),
                n: src.n,
            };
            (src, dst, r.below(2))
        })
        .collect();
    let mut acts: Vec<Act> = (0..ncopies).map(Act::Start).collect();
    // Waits for the started copies' sizes (sometimes split in halves, sometimes merged per semaphore)
    // and a few arbitrary ones.
    for (k, c) in copies.iter().enumerate() {
        match r.below(6) {
            0 => {}
            1 if c.0.n == 16 => {
                acts.push(Act::Wait { sem: c.2, n: 8 });
                acts.push(Act::Wait { sem: c.2, n: 8 });
            }
            2 => acts.push(Act::Wait {
                sem: r.below(2),
                n: [8, 16][r.below(2)],
            }),
            _ => acts.push(Act::Wait { sem: c.2, n: c.0.n }),
        }
        let _ = k;
    }
    for _ in 0..r.below(5) {
        let buf = 1 + r.below(2);
        let w = random_window(r, buf);
        acts.push(if r.below(2) == 0 {
            Act::Read(w)
        } else {
            Act::Write(w)
        });
    }
    // Stir: random swaps of neighbours (any order is a schedule — a wait before its start is a
    // deadlock — but mostly starts before waits, so every verdict is common).
    for _ in 0..acts.len() {
        let i = r.below(acts.len());
        if i + 1 < acts.len() {
            acts.swap(i, i + 1);
        }
    }
    Schedule { copies, acts }
}

/// The schedule as a kernel over a grid of 2 `parallel` steps (each step runs the whole schedule and
/// writes its own output block).
fn schedule_kernel(s: &Schedule) -> PallasCall {
    let s = s.clone();
    pallas_call(
        move |x: Ref<f32, Any>, o: RefMut<f32>, a: RefMut<f32>, b: RefMut<f32>, sem: DmaSem| {
            let win = |w: Win| rows(w.start, w.n);
            let copy = |src: Win, dst: Win, k: usize| {
                let d = if dst.buf == 1 { a } else { b };
                match src.buf {
                    0 => async_copy(x.at(win(src)), d.at(win(dst)), sem.at(k as i32)),
                    _ => async_copy(a.at(win(src)), d.at(win(dst)), sem.at(k as i32)),
                }
            };
            o.store(full([ROWS, 128], 0.0f32));
            for act in &s.acts {
                match *act {
                    Act::Start(k) => {
                        let (src, dst, sem) = s.copies[k];
                        copy(src, dst, sem).start();
                    }
                    Act::Wait { sem, n } => {
                        let w = Win {
                            buf: 0,
                            start: 0,
                            n,
                        };
                        copy(w, Win { buf: 1, ..w }, sem).wait();
                    }
                    Act::Read(w) => {
                        let v = if w.buf == 1 {
                            a.at(win(w)).load()
                        } else {
                            b.at(win(w)).load()
                        };
                        o.at(win(w)).store(v);
                    }
                    Act::Write(w) => {
                        let v = full([w.n, 128], 1.5f32);
                        if w.buf == 1 {
                            a.at(win(w)).store(v);
                        } else {
                            b.at(win(w)).store(v);
                        }
                    }
                }
            }
        },
    )
    .name("schedule")
    .grid([2])
    .dimension_semantics([Parallel])
    .input_any(f32s(ROWS))
    .output(f32s(2 * ROWS), BlockSpec::new([ROWS, 128], |[i]| (i, 0)))
    .scratch(Vmem::new([ROWS, 128], F32))
    .scratch(Vmem::new([ROWS, 128], F32))
    .scratch(DmaSem::array([2]))
    .build()
    .expect("build")
}

#[test]
fn random_schedules_get_the_reference_models_verdict() {
    let n: usize = std::env::var("DMA_SCHEDULES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let x = ramp(ROWS);
    let mut r = Rng(0x9E37_79B9_7F4A_7C15);
    let mut counts = std::collections::BTreeMap::new();
    let mut mosaic_checked = 0;
    for i in 0..n {
        let s = random_schedule(&mut r);
        let want = model(&s);
        *counts.entry(format!("{want:?}")).or_insert(0) += 1;
        let call = schedule_kernel(&s);
        for (parallel, seed) in [
            (false, None),
            (true, None),
            (true, Some(i as u64)),
            (false, Some(7)),
        ] {
            let got = interpret(&call, &x, parallel, seed);
            assert_eq!(
                verdict(&got),
                want,
                "schedule {i} (parallel {parallel}, dma_seed {seed:?}): {s:?}\n{:?}",
                got.err()
            );
        }
        // Mosaic-on-CPU lands copies at their start, so it sees no race; where the model's verdict is
        // ok or a deadlock (no race before it), it gives the same one — and the same bits when ok.
        if i % 10 == 0 && want != Some(ErrorKind::Race) {
            let ours = interpret(&call, &x, false, None);
            let theirs = mosaic_cpu::run(call.ir(), std::slice::from_ref(&x));
            assert_eq!(verdict(&theirs), want, "schedule {i} in mosaic_cpu: {s:?}");
            if let (Ok(a), Ok(b)) = (&ours, &theirs) {
                assert_eq!(
                    a[0].as_slice::<f32>(),
                    b[0].as_slice::<f32>(),
                    "schedule {i}"
                );
            }
            mosaic_checked += 1;
        }
    }
    println!("{n} schedules, verdicts {counts:?}; {mosaic_checked} also through mosaic_cpu");
    for kind in ["None", "Some(Race)", "Some(Deadlock)"] {
        assert!(
            counts.get(kind).copied().unwrap_or(0) * 20 >= n,
            "each verdict should be common (≥ 5%): {counts:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------- descriptors

/// Copy descriptors kept in a `Vec` (Pallas's Python list of `make_async_copy`): made in one unrolled
/// loop, started in another, each waited by its own descriptor in a third.
#[tpu_kernel]
fn descriptor_list_kernel(
    x: Ref<f32, Any>,
    o: RefMut<f32>,
    a: RefMut<f32>,
    _b: RefMut<f32>,
    s: DmaSem,
) {
    let mut copies = vec![];
    for p in unroll(0..4) {
        copies.push(async_copy(
            x.at(rows(8 * p, 8)),
            a.at(rows(8 * p, 8)),
            s.at(p % 2),
        ));
    }
    for c in unroll(&copies) {
        c.start();
    }
    for (p, c) in unroll(copies.iter().enumerate()) {
        c.wait();
        o.at(rows(8 * p, 8))
            .store(a.at(rows(8 * p, 8)).load() + 1.0);
    }
}

#[test]
fn copy_descriptors_kept_in_a_vec_are_started_and_waited_later() {
    let call = one_step(descriptor_list_kernel);
    let x = ramp(ROWS);
    let want: Vec<f32> = x
        .as_slice::<f32>()
        .unwrap()
        .iter()
        .map(|v| v + 1.0)
        .collect();
    // Each wait takes one page's bytes from a semaphore with two pages outstanding: after the first
    // wait on a semaphore neither page is known complete, so reading page 0 there is a race.
    let e = interpret(&call, &x, false, None).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Race, "{e}");
    // With the reads after all the waits, it runs — in both engines.
    let ok = one_step(|x, o, a, _b, s| {
        let mut copies = vec![];
        for p in unroll(0..4) {
            copies.push(async_copy(
                x.at(rows(8 * p, 8)),
                a.at(rows(8 * p, 8)),
                s.at((p % 2) as i32),
            ));
        }
        for c in unroll(&copies) {
            c.start();
        }
        for c in unroll(copies.iter()) {
            c.wait();
        }
        o.store(a.load() + 1.0);
    });
    let out = interpret(&ok, &x, false, None).expect("interpret");
    assert_eq!(out[0].as_slice::<f32>().unwrap(), &want[..]);
    let mosaic = mosaic_cpu::run(ok.ir(), std::slice::from_ref(&x)).expect("mosaic_cpu");
    assert_eq!(mosaic[0].as_slice::<f32>().unwrap(), &want[..]);
    assert!(
        ok.mosaic_mlir()
            .expect("lower")
            .matches("tpu.enqueue_dma")
            .count()
            == 4
    );
}
