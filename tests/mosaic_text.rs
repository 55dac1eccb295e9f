//! `mosaic_mlir()`, the readable Mosaic text, parses under jaxlib as well as under our MLIR: the ops
//! whose custom syntax differs between LLVM 22 and jaxlib's MLIR are printed in the generic form. Here:
//! every example and every op-coverage kernel's text holds no version-specific custom syntax; with `TPU_KERNEL_MOSAIC_TEXT_DUMP=dir` the texts are written for
//! `python/tests/test_mosaic_text.py`, which parses each under jaxlib's tpu dialect.

mod common;
use common::coverage;

use tpu_kernel::prelude::*;

fn kernels() -> Vec<(String, PallasCall)> {
    let mut all: Vec<(String, PallasCall)> = common::all_examples()
        .map(|(name, build)| {
            (
                name.to_string(),
                build().unwrap_or_else(|e| panic!("{name}: {e}")),
            )
        })
        .collect();
    all.extend(
        coverage::calls()
            .into_iter()
            .map(|(n, c)| (format!("coverage_{n}"), c)),
    );
    all
}

#[test]
fn the_readable_mosaic_text_is_portable() {
    let dump = std::env::var("TPU_KERNEL_MOSAIC_TEXT_DUMP").ok();
    let mut slices = 0;
    for (name, call) in kernels() {
        let text = call.mosaic_mlir().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            !text.contains(" = vector.extract_strided_slice "),
            "{name}: LLVM 22's custom syntax of vector.extract_strided_slice (jaxlib reads another)"
        );
        slices += text.matches("\"vector.extract_strided_slice\"").count();
        if let Some(dir) = &dump {
            std::fs::create_dir_all(dir).expect("dump dir");
            std::fs::write(format!("{dir}/{name}.mlir"), &text).expect("write");
        }
    }
    assert!(
        slices > 0,
        "no kernel here slices a value: the test checks nothing"
    );
}
