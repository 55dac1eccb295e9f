//! Ref views and value bitcasts (issue 21 item 4): `r.bitcast::<U>()`, `r.reshape([..])`, windows of
//! them, DMA through them, and `x.bitcast::<U>()` on values — against plain-Rust references of
//! Pallas's rule (a bitcast that changes the bit width packs consecutive rows of the second-to-last
//! dimension into one element, the lowest bits first; `python/tests/test_ref_views.py` holds Pallas's
//! interpret mode to the same formula), their lowering in Pallas's forms, the race rules through views,
//! and each mistake at its line; Mosaic-on-CPU (reading the emitted views) gives the interpreter's bits.

use half::bf16;
use tpu_kernel::prelude::*;
use tpu_kernel::runtime::mosaic_cpu;
use tpu_kernel::{ErrorKind, KernelError};

fn bf16_input(rows: usize) -> HostArray {
    let v: Vec<bf16> = (0..rows * 128)
        .map(|i| bf16::from_f32((i as f32 * 0.37 - 11.0) * if i % 3 == 0 { -1.0 } else { 1.0 }))
        .collect();
    HostArray::from_vec([rows, 128], v).unwrap()
}

/// Rows `2r` and `2r + 1` of a bf16 `[rows, 128]` array packed into u32 row `r`, row `2r` low.
fn pack(x: &[bf16], rows: usize) -> Vec<u32> {
    let mut out = vec![0u32; rows / 2 * 128];
    for r in 0..rows / 2 {
        for j in 0..128 {
            let lo = x[2 * r * 128 + j].to_bits() as u32;
            let hi = x[(2 * r + 1) * 128 + j].to_bits() as u32;
            out[r * 128 + j] = lo | (hi << 16);
        }
    }
    out
}

/// The inverse of [`pack`].
fn unpack(w: &[u32]) -> Vec<bf16> {
    let rows = w.len() / 128;
    let mut out = vec![bf16::ZERO; rows * 2 * 128];
    for r in 0..rows {
        for j in 0..128 {
            out[2 * r * 128 + j] = bf16::from_bits(w[r * 128 + j] as u16);
            out[(2 * r + 1) * 128 + j] = bf16::from_bits((w[r * 128 + j] >> 16) as u16);
        }
    }
    out
}

fn bits(v: &[bf16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A bf16 block read through its u32 view; a value bitcast to u32, changed, written back through an
/// output's u32 view and, narrowed by a value bitcast, stored directly.
fn bitcast_call() -> PallasCall {
    pallas_call(
        |x: Ref<bf16>, o: RefMut<u32>, n: RefMut<bf16>, m: RefMut<bf16>| {
            o.store(x.bitcast::<u32>().load());
            let w = x.load().bitcast::<u32>() + 0x0001_0001u32;
            n.bitcast::<u32>().store(w);
            m.store(w.bitcast::<bf16>());
        },
    )
    .grid([2])
    .input(
        ArrayType::new([32, 128], BF16),
        BlockSpec::new([16, 128], |[i]| (i, 0)),
    )
    .output(
        ArrayType::new([16, 128], U32),
        BlockSpec::new([8, 128], |[i]| (i, 0)),
    )
    .output(
        ArrayType::new([32, 128], BF16),
        BlockSpec::new([16, 128], |[i]| (i, 0)),
    )
    .output(
        ArrayType::new([32, 128], BF16),
        BlockSpec::new([16, 128], |[i]| (i, 0)),
    )
    .build()
    .expect("build")
}

#[test]
fn bitcasts_pack_rows_lowest_bits_first_in_refs_and_values() {
    let call = bitcast_call();
    let x = bf16_input(32);
    let xs = x.as_slice::<bf16>().unwrap();
    let mut packed = Vec::new();
    for b in 0..2 {
        packed.extend(pack(&xs[b * 16 * 128..(b + 1) * 16 * 128], 16));
    }
    let bumped: Vec<u32> = packed.iter().map(|w| w.wrapping_add(0x0001_0001)).collect();
    let want_n = bits(&unpack(&bumped));
    for fuse in [false, true] {
        let opts = InterpretOptions {
            fuse,
            ..InterpretOptions::default()
        };
        let out = call
            .interpret_with(std::slice::from_ref(&x), &opts)
            .expect("interpret");
        assert_eq!(out[0].as_slice::<u32>().unwrap(), &packed[..], "ref view");
        assert_eq!(
            bits(out[1].as_slice::<bf16>().unwrap()),
            want_n,
            "store through a view"
        );
        assert_eq!(
            bits(out[2].as_slice::<bf16>().unwrap()),
            want_n,
            "value bitcast"
        );
    }
    let text = call.mosaic_mlir().expect("verified module");
    for op in ["tpu.memref_bitcast", "tpu.bitcast"] {
        assert!(text.contains(op), "{op} missing:\n{text}");
    }
}

/// Leading dimensions folded into rows (Pallas's `ref.reshape`), reads and writes through windows of
/// reshaped scratch (`s.at(1).reshape(..)`, the ragged-paged-attention output idiom).
fn reshape_call() -> PallasCall {
    pallas_call(|x: Ref<f32>, o: RefMut<f32>, s: RefMut<f32>| {
        s.at(1).reshape([2, 8, 128]).store(x.at(0..2).load());
        s.at(0).reshape([2, 8, 128]).store(x.at(2..4).load());
        o.store(s.reshape([32, 128]).load() + x.reshape([32, 128]).load() * 2.0f32);
    })
    .grid([2])
    .input(
        ArrayType::new([8, 8, 128], F32),
        BlockSpec::new([4, 8, 128], |[i]| (i, 0, 0)),
    )
    .output(
        ArrayType::new([64, 128], F32),
        BlockSpec::new([32, 128], |[i]| (i, 0)),
    )
    .scratch(Vmem::new([2, 16, 128], F32))
    .build()
    .expect("build")
}

#[test]
fn reshapes_keep_row_major_order_for_reads_and_writes() {
    let call = reshape_call();
    let xv: Vec<f32> = (0..8 * 8 * 128).map(|i| i as f32 * 0.25 - 7.0).collect();
    let x = HostArray::from_vec([8, 8, 128], xv.clone()).unwrap();
    let mut want = Vec::new();
    for b in 0..2 {
        let blk = &xv[b * 4096..(b + 1) * 4096];
        // The scratch, flat: blocks 2, 3 (slot 0) then blocks 0, 1 (slot 1), 1024 elements each.
        let s: Vec<f32> = [&blk[2048..4096], &blk[..2048]].concat();
        want.extend(s.iter().zip(blk).map(|(a, x)| a + x * 2.0));
    }
    let out = call.interpret(std::slice::from_ref(&x)).expect("interpret");
    assert_eq!(out[0].as_slice::<f32>().unwrap(), &want[..]);
    let text = call.mosaic_mlir().expect("verified module");
    assert!(text.contains("tpu.memref_reshape"), "{text}");
}

/// The ragged-paged-attention cache idiom: an HBM array of pages `[P, S, 128]` seen as rows
/// `[P * S, 128]`, and a copy of 16 rows from a run-time row (crossing a page boundary).
fn pages_call() -> PallasCall {
    pallas_call(
        |idx: Ref<i32, Smem>, x: Ref<f32, Any>, o: RefMut<f32>, buf: RefMut<f32>, sem: DmaSem| {
            let rows = x.reshape([64 * 8, 128]);
            let c = async_copy(rows.at(ds(idx.at(0).load(), 16)), buf, sem.at(0));
            c.start();
            c.wait();
            o.store(buf.load());
        },
    )
    .grid([1])
    .scalar_prefetch(ArrayType::new([1], I32))
    .input_any(ArrayType::new([64, 8, 128], F32))
    .output(
        ArrayType::new([16, 128], F32),
        BlockSpec::new([16, 128], |[_]| (0, 0)),
    )
    .scratch(Vmem::new([16, 128], F32))
    .scratch(DmaSem::array([1]))
    .build()
    .expect("build")
}

#[test]
fn a_copy_from_a_reshaped_hbm_ref_takes_rows_across_pages() {
    let call = pages_call();
    let xv: Vec<f32> = (0..64 * 8 * 128).map(|i| i as f32).collect();
    let x = HostArray::from_vec([64, 8, 128], xv.clone()).unwrap();
    for start in [0usize, 12, 496] {
        let idx = HostArray::from_vec([1], vec![start as i32]).unwrap();
        let out = call
            .interpret(&[idx.clone(), x.clone()])
            .expect("interpret");
        assert_eq!(
            out[0].as_slice::<f32>().unwrap(),
            &xv[start * 128..(start + 16) * 128],
            "start {start}"
        );
    }
    // Past the end: the window is checked against the view's shape at run time.
    let idx = HostArray::from_vec([1], vec![505]).unwrap();
    let e = call.interpret(&[idx, x]).unwrap_err();
    assert_eq!(e.kind, ErrorKind::OutOfBounds, "{e}");
    assert!(e.to_string().contains("[512, 128]"), "{e}");
}

/// Copies into one slot of a double buffer while the other is read through a bitcast view: no race;
/// reading the slot being filled through the view is one.
#[test]
fn races_are_found_through_views_and_only_where_the_view_reaches() {
    let run = |read_slot: usize| {
        pallas_call(
            move |x: Ref<bf16, Any>, o: RefMut<u32>, buf: RefMut<bf16>, sem: DmaSem| {
                let c = async_copy(x, buf.at(0), sem.at(0));
                c.start();
                o.store(buf.bitcast::<u32>().at(read_slot).load());
                c.wait();
            },
        )
        .input_any(ArrayType::new([16, 128], BF16))
        .output(
            ArrayType::new([8, 128], U32),
            BlockSpec::new([8, 128], |[]| (0, 0)),
        )
        .scratch(Vmem::new([2, 16, 128], BF16))
        .scratch(DmaSem::array([1]))
        .build()
        .expect("build")
        .interpret(&[bf16_input(16)])
    };
    run(1).expect("the other slot is not being written");
    let e: KernelError = run(0).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Race, "{e}");
}

/// Mistakes, each at its line, each with libtpu's reason.
#[test]
fn view_mistakes_are_errors_at_their_lines() {
    fn check(call: Result<PallasCall, KernelError>, line: u32, has: &str) {
        let Err(e) = call else {
            panic!("refused at line {line}")
        };
        assert!(e.to_string().contains(has), "{e}");
        let loc = e.location.expect("located");
        assert_eq!(
            (loc.file.ends_with("ref_views.rs"), loc.line),
            (true, line),
            "{e}"
        );
    }
    let spec = |s: [usize; 2]| BlockSpec::new(s, |[]| (0, 0));
    let lanes = line!() + 2;
    let call = pallas_call(|x: Ref<f32>, o: RefMut<f32>| {
        o.store(x.reshape([16, 128]).load());
    })
    .input(ArrayType::new([8, 256], F32), spec([8, 256]))
    .output(ArrayType::new([16, 128], F32), spec([16, 128]))
    .build();
    check(call, lanes, "the last (lane) dimension must stay 256");

    let rows = line!() + 2;
    let call = pallas_call(|x: Ref<f32>, o: RefMut<f32>| {
        o.store(x.reshape([48, 128]).load());
    })
    .input(
        ArrayType::new([4, 12, 128], F32),
        BlockSpec::new([4, 12, 128], |[]| (0, 0, 0)),
    )
    .output(ArrayType::new([48, 128], F32), spec([48, 128]))
    .build();
    check(call, rows, "Reshape on a non-contiguous memref");

    let gap = line!() + 2;
    let call = pallas_call(|x: Ref<f32>, o: RefMut<f32>| {
        o.store(x.at((.., 0..8)).reshape([16, 128]).load());
    })
    .input(
        ArrayType::new([2, 16, 128], F32),
        BlockSpec::new([2, 16, 128], |[]| (0, 0, 0)),
    )
    .output(ArrayType::new([16, 128], F32), spec([16, 128]))
    .build();
    check(call, gap, "not one contiguous run");

    let odd = line!() + 2;
    let call = pallas_call(|x: Ref<bf16>, o: RefMut<u32>| {
        o.store(x.load().bitcast::<u32>());
    })
    .input(ArrayType::new([15, 128], BF16), spec([15, 128]))
    .output(ArrayType::new([7, 128], U32), spec([7, 128]))
    .build();
    check(call, odd, "use a multiple of 2 rows");

    let int4 = line!() + 2;
    let call = pallas_call(|x: Ref<i8>, o: RefMut<i8>| {
        o.store(x.load().cast::<tpu_kernel::dtype::i4>().bitcast::<i8>());
    })
    .input(ArrayType::new([64, 128], I8), spec([64, 128]))
    .output(ArrayType::new([32, 128], I8), spec([32, 128]))
    .build();
    check(call, int4, "cannot bitcast a value of int4");

    let smem = line!() + 2;
    let call = pallas_call(|t: Ref<i32, Smem>, o: RefMut<f32>| {
        let _ = t.reshape([2, 4]);
        o.store(0.0f32);
    })
    .scalar_prefetch(ArrayType::new([8], I32))
    .output(ArrayType::new([8, 128], F32), spec([8, 128]))
    .build();
    check(call, smem, "cannot reshape an SMEM ref");
}

/// Mosaic-on-CPU runs the emitted views (`tpu.memref_bitcast`, `tpu.memref_reshape`, `tpu.bitcast`)
/// and gives the interpreter's bits on every view kernel.
#[test]
fn mosaic_on_cpu_gives_the_interpreters_bits_through_views() {
    let pages: Vec<f32> = (0..64 * 8 * 128).map(|i| i as f32).collect();
    let cases = [
        (bitcast_call(), vec![bf16_input(32)]),
        (
            reshape_call(),
            vec![HostArray::from_vec(
                [8, 8, 128],
                (0..8 * 8 * 128)
                    .map(|i| i as f32 * 0.25 - 7.0)
                    .collect::<Vec<_>>(),
            )
            .unwrap()],
        ),
        (
            pages_call(),
            vec![
                HostArray::from_vec([1], vec![12i32]).unwrap(),
                HostArray::from_vec([64, 8, 128], pages).unwrap(),
            ],
        ),
    ];
    for (call, inputs) in cases {
        let want = call.interpret(&inputs).expect("interpret");
        let got = mosaic_cpu::run(call.ir(), &inputs).expect("mosaic_cpu");
        assert_eq!(got, want, "{}", call.ir().name);
    }
}

/// The kernels `python/tests/test_ref_views.py` compiles beside their Pallas twins.
fn view_kernels() -> Vec<(&'static str, PallasCall)> {
    vec![
        ("bitcast", bitcast_call()),
        ("reshape", reshape_call()),
        ("pages", pages_call()),
        ("as_ref", as_ref_call()),
    ]
}

/// With `TPU_KERNEL_VIEWS_OUT=DIR` (and `TPU_KERNEL_VIEWS_TARGET=<generation>`): each view kernel,
/// built for that target, as `DIR/<name>.stablehlo.mlir` for libtpu.
#[test]
#[ignore = "run by python/tests/test_ref_views.py"]
fn export_view_kernels() {
    use tpu_kernel::runtime::serialize::CustomCall;
    let dir = std::path::PathBuf::from(
        std::env::var("TPU_KERNEL_VIEWS_OUT").expect("set TPU_KERNEL_VIEWS_OUT"),
    );
    let target = std::env::var("TPU_KERNEL_VIEWS_TARGET")
        .map(|t| Target::parse(&t).expect("TPU_KERNEL_VIEWS_TARGET"))
        .unwrap_or_default();
    std::fs::create_dir_all(&dir).expect("create the output directory");
    for (name, call) in target.scope(view_kernels) {
        let hlo = CustomCall::new(call.ir()).stablehlo().expect("StableHLO");
        std::fs::write(dir.join(format!("{name}.stablehlo.mlir")), hlo).expect("write");
    }
}

/// Reshapes of a VMEM scratch `[lead.., rows, 128]` into `[..]`: each case and whether `build()`
/// accepts it, for `python/tests/test_ref_views.py` to compile with libtpu (its verdict must be ours).
fn reshape_sweep() -> Vec<(Vec<usize>, Vec<usize>, DType, bool)> {
    let mut cases = Vec::new();
    for d in [F32, BF16, I8] {
        for r in [1usize, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24] {
            cases.push((vec![4, r, 128], vec![4 * r, 128], d));
            cases.push((vec![4 * r, 128], vec![4, r, 128], d));
            cases.push((vec![2, 3, r, 128], vec![6, r, 128], d));
        }
        cases.push((vec![8, 256], vec![16, 128], d));
    }
    cases
        .into_iter()
        .map(|(from, to, d)| {
            let ok = match d {
                F32 => reshape_builds::<f32>(&from, &to),
                BF16 => reshape_builds::<bf16>(&from, &to),
                _ => reshape_builds::<i8>(&from, &to),
            };
            (from, to, d, ok)
        })
        .collect()
}

fn reshape_builds<T: tpu_kernel::runtime::dtype::Element>(from: &[usize], to: &[usize]) -> bool {
    let t = to.to_vec();
    pallas_call(move |o: RefMut<f32>, s: RefMut<T>| {
        let _ = s.reshape(&t);
        o.store(0.0f32);
    })
    .output(
        ArrayType::new([8, 128], F32),
        BlockSpec::new([8, 128], |[]| (0, 0)),
    )
    .scratch(Vmem::new(from, T::DTYPE))
    .build()
    .is_ok()
}

/// With `TPU_KERNEL_VIEWS_SWEEP=FILE`: [`reshape_sweep`] as JSON lines `[from, to, dtype, ok]`.
#[test]
#[ignore = "run by python/tests/test_ref_views.py"]
fn export_reshape_sweep() {
    let path = std::env::var("TPU_KERNEL_VIEWS_SWEEP").expect("set TPU_KERNEL_VIEWS_SWEEP");
    let lines: Vec<String> = reshape_sweep()
        .into_iter()
        .map(|(f, t, d, ok)| format!("[{f:?}, {t:?}, \"{}\", {ok}]", d.name()))
        .collect();
    std::fs::write(path, lines.join("\n")).expect("write");
}

/// A window as a ref of its own (`w.as_ref()`, Pallas's `r.at[i]`): its windows, loads and stores
/// address the ref it was taken from, in both engines.
fn as_ref_call() -> PallasCall {
    pallas_call(|x: Ref<f32>, o: RefMut<f32>| {
        let slot = x.at(1).as_ref();
        o.at(0).as_ref().store(slot.load() * 2.0f32);
        o.at(1)
            .as_ref()
            .at(ds(8, 8))
            .store(slot.at(ds(0, 8)).load());
        o.at(1)
            .as_ref()
            .at(ds(0, 8))
            .store(x.at(0).as_ref().at(ds(8, 8)).load());
    })
    .input(
        ArrayType::new([2, 16, 128], F32),
        BlockSpec::new([2, 16, 128], |[]| (0, 0, 0)),
    )
    .output(
        ArrayType::new([2, 16, 128], F32),
        BlockSpec::new([2, 16, 128], |[]| (0, 0, 0)),
    )
    .build()
    .expect("build")
}

#[test]
fn a_window_as_a_ref_reads_and_writes_its_ref() {
    let call = as_ref_call();
    let xv: Vec<f32> = (0..2 * 16 * 128).map(|i| i as f32 - 100.0).collect();
    let x = HostArray::from_vec([2, 16, 128], xv.clone()).unwrap();
    let mut want: Vec<f32> = xv[2048..].iter().map(|v| v * 2.0).collect();
    want.extend_from_slice(&xv[1024..2048]);
    want.extend_from_slice(&xv[2048..2048 + 1024]);
    let out = call.interpret(std::slice::from_ref(&x)).expect("interpret");
    assert_eq!(out[0].as_slice::<f32>().unwrap(), &want[..]);
    let got = mosaic_cpu::run(call.ir(), std::slice::from_ref(&x)).expect("mosaic_cpu");
    assert_eq!(got, out);
}
