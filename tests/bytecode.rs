//! The body we ship is written straight from the lowered module as data (`serialize::bytecode`), with no
//! MLIR module built. These tests hold it to the reference path — build the module with MLIR, verify,
//! rewrite to the mosaic-serde form, MLIR's own bytecode writer — on every example and on an op-coverage
//! suite, at every supported version: MLIR must read both as the same module, locations included.
//! (The Python suite checks the same bytes against jaxlib's serializer and libtpu.)

mod common;

use tpu_kernel::runtime::serialize::body;
use tpu_kernel::runtime::serialize::{MAX_VERSION, MIN_VERSION};
use tpu_kernel::PallasCall;

/// MLIR's reading of the direct body and of the reference body, with locations.
fn both(call: &PallasCall, version: i64) -> (String, String) {
    let k = call.ir();
    let ours = body::body_bytecode(k, version).expect("direct body");
    let reference = body::reference_bytecode(k, version).expect("reference body");
    (
        body::read_body(&ours, true).expect("MLIR reads the direct body"),
        body::read_body(&reference, true).expect("MLIR reads the reference body"),
    )
}

fn assert_same(name: &str, call: &PallasCall) {
    for v in MIN_VERSION..=MAX_VERSION {
        let (ours, reference) = both(call, v);
        if let Some((a, b)) = ours.lines().zip(reference.lines()).find(|(a, b)| a != b) {
            panic!("{name} at version {v}: the direct body reads\n  {a}\nwhere the reference reads\n  {b}");
        }
        assert_eq!(
            ours.lines().count(),
            reference.lines().count(),
            "{name} at version {v}"
        );
    }
}

#[test]
fn every_example_body_reads_as_the_reference_body() {
    for (name, build) in common::all_examples() {
        assert_same(name, &build().expect("example builds"));
    }
}

use common::coverage::calls;

#[test]
fn the_op_coverage_suite_reads_as_the_reference_body() {
    for (name, call) in calls() {
        assert_same(name, &call);
    }
}

#[test]
fn the_op_coverage_suite_reaches_every_rule() {
    // Every Mosaic op name the lowering can emit: the op table's (per dtype class) and the literals of
    // lower/rules.rs and lower/rules/*.rs (the ops outside the table). The suite and the examples must
    // emit all of them.
    let text: String = calls()
        .into_iter()
        .chain(common::all_examples().map(|(n, b)| (*n, b().expect("example builds"))))
        .map(|(_, c)| body::body_text(c.ir(), MAX_VERSION).expect("body text"))
        .collect();
    let names = common::coverage::lowering_op_names();
    assert!(names.len() > 50, "found only {names:?}");
    let missing: Vec<_> = names
        .iter()
        .filter(|n| !text.contains(&format!("\"stable_mosaic.{n}\"")))
        .collect();
    assert!(missing.is_empty(), "not covered by the suite: {missing:?}");
}
