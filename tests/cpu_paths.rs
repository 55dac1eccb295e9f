//! Every dispatch path gives the plain path's bits (issue 22): each example and op-coverage kernel run
//! natively (AVX-512, its BF16 and VNNI dot kernels where the CPU has them), then in a child process
//! capped by `TPU_KERNEL_CPU=avx2` (the AVX2 loops, the portable dots) and `TPU_KERNEL_CPU=scalar`; the
//! outputs must be equal bit for bit (but for [`BF16_DOT_ORDER`]), and each child must report the cap
//! it ran under.

mod common;

use std::io::{Read, Write};
use std::process::Command;
use tpu_kernel::reference;
use tpu_kernel::runtime::interpret::HostArray;
use tpu_kernel::runtime::math::cpu;

/// The kernels with a bf16 × bf16 `dot`: on a CPU with AVX-512 BF16 its kernel (`vdpbf16ps`: pairs of
/// exact products, each added with one rounding, subnormals flushed) adds in another order than the
/// f32 GEMM the capped paths widen to (`interpret/dot_bf16.rs`), so their outputs agree within bf16
/// rounding, not bit for bit — the one known exception, to be closed by giving every bf16 path
/// `vdpbf16ps`'s order (issue 22).
const BF16_DOT_ORDER: &[&str] = &[
    "matmul",
    "grouped_matmul",
    "quantized_matmul",
    "flash_attention",
    "ragged_paged_attention",
    "coverage dot",
];

/// Every example's and coverage kernel's outputs on seeded random inputs, as f64 bit patterns (exact
/// for every dtype the kernels produce, NaN payloads included).
fn outputs() -> Vec<(String, Vec<u64>)> {
    let mut calls: Vec<(String, tpu_kernel::PallasCall)> = common::EXAMPLES
        .iter()
        .map(|(n, b)| (n.to_string(), b().expect("builds")))
        .collect();
    calls.extend(
        common::coverage::calls()
            .into_iter()
            .map(|(n, c)| (format!("coverage {n}"), c)),
    );
    calls
        .into_iter()
        .map(|(name, call)| {
            let inputs = reference::random_inputs(&call, 7);
            let out = call
                .interpret(&inputs)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let bits = out
                .iter()
                .flat_map(HostArray::to_f64_vec)
                .map(f64::to_bits)
                .collect();
            (name, bits)
        })
        .collect()
}

/// Run by [`capped_paths_give_the_native_bits`] in a child process: writes what it dispatched to,
/// then every output, into `TPU_KERNEL_CPU_OUT`.
#[test]
#[ignore = "run by capped_paths_give_the_native_bits in a child process"]
fn child_writes_outputs() {
    let path = std::env::var("TPU_KERNEL_CPU_OUT").expect("TPU_KERNEL_CPU_OUT");
    let mut f = std::fs::File::create(path).expect("create");
    let describe = cpu::describe();
    writeln!(f, "{describe}").expect("write");
    for (name, bits) in outputs() {
        writeln!(f, "{name} {}", bits.len()).expect("write");
        let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        f.write_all(&bytes).expect("write");
        writeln!(f).expect("write");
    }
}

#[test]
fn capped_paths_give_the_native_bits() {
    let native = outputs();
    println!("native: {}", cpu::describe());
    let dir = std::env::temp_dir();
    for level in ["avx2", "scalar"] {
        let path = dir.join(format!("tpu_kernel_cpu_{level}_{}.bin", std::process::id()));
        let status = Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--ignored",
                "--exact",
                "child_writes_outputs",
                "--test-threads",
                "1",
            ])
            .env("TPU_KERNEL_CPU", level)
            .env("TPU_KERNEL_CPU_OUT", &path)
            .status()
            .expect("run the child");
        assert!(status.success(), "{level}: the child failed");
        let mut data = Vec::new();
        std::fs::File::open(&path)
            .expect("open")
            .read_to_end(&mut data)
            .expect("read");
        let _ = std::fs::remove_file(&path);
        let mut at = 0;
        let line = |data: &[u8], at: &mut usize| {
            let end = *at
                + data[*at..]
                    .iter()
                    .position(|b| *b == b'\n')
                    .expect("a line");
            let s = String::from_utf8(data[*at..end].to_vec()).expect("utf-8");
            *at = end + 1;
            s
        };
        let describe = line(&data, &mut at);
        println!("{level}: {describe}");
        assert!(
            describe.contains("capped by TPU_KERNEL_CPU") && !describe.contains("avx512"),
            "{level}: {describe}"
        );
        if level == "scalar" {
            assert!(describe.starts_with("scalar"), "{describe}");
        }
        for (name, want) in &native {
            let head = line(&data, &mut at);
            assert_eq!(head, format!("{name} {}", want.len()), "{level}");
            let got: Vec<u64> = data[at..at + 8 * want.len()]
                .chunks(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect();
            at += 8 * want.len() + 1;
            let diff = got.iter().zip(want).position(|(a, b)| a != b);
            if cpu::avx512_bf16() && BF16_DOT_ORDER.contains(&name.as_str()) {
                // Not yet one order: within bf16 rounding of the native result.
                let close = got.iter().zip(want).all(|(a, b)| {
                    let (a, b) = (f64::from_bits(*a), f64::from_bits(*b));
                    (a - b).abs() <= 2e-2 * b.abs().max(1.0) || (a.is_nan() && b.is_nan())
                });
                assert!(
                    close,
                    "{level}: {name} is not within bf16 rounding of the native path"
                );
                continue;
            }
            assert!(
                diff.is_none(),
                "{level}: {name} differs from the native path at element {diff:?}"
            );
        }
    }
}
