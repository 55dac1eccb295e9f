//! Named trace regions (`named_scope`, Pallas's `jax.named_scope` in a kernel): `tpu.trace_start` /
//! `tpu.trace_stop` pairs in the Mosaic module, properly nested, no effect on the numbers.

use tpu_kernel::prelude::*;
use tpu_kernel::ErrorKind;

#[path = "common/kernels.rs"]
mod kernels;

#[test]
fn regions_nest_in_the_module_and_change_nothing_else() {
    let call = kernels::regions_call().expect("build");
    let text = call.mosaic_mlir().expect("lower");
    let marks: Vec<&str> = text
        .lines()
        .filter_map(|l| {
            if l.contains("tpu.trace_start") {
                Some(if l.contains("\"softmax\"") {
                    "start softmax"
                } else {
                    "start exp"
                })
            } else if l.contains("tpu.trace_stop") {
                Some("stop")
            } else {
                None
            }
        })
        .collect();
    assert_eq!(
        marks,
        ["start softmax", "start exp", "stop", "stop"],
        "{text}"
    );
    assert!(text.contains("level = 10 : i32"), "{text}");
    // Same numbers as without the regions: softmax rows sum to one.
    let x = HostArray::from_vec(
        [16, 128],
        (0..16 * 128)
            .map(|i| (i % 17) as f32 * 0.1)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let out = call.interpret(&[x]).expect("interpret");
    for row in out[0].as_slice::<f32>().unwrap().chunks(128) {
        let s: f32 = row.iter().sum();
        assert!((s - 1.0).abs() < 1e-5, "{s}");
    }
}

#[tpu_kernel]
fn bad_name_kernel(x: Ref<f32>, o: RefMut<f32>) {
    let _scope = named_scope("a \"quoted\" name");
    o.store(x.load());
}

#[test]
fn a_region_name_that_is_not_plain_text_is_an_error_at_its_line() {
    let e = pallas_call(bad_name_kernel)
        .input(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[]| (0, 0)),
        )
        .output(
            ArrayType::new([8, 128], F32),
            BlockSpec::new([8, 128], |[]| (0, 0)),
        )
        .build()
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Trace, "{e}");
    assert!(e.message.contains("trace region name"), "{e}");
    let line = include_str!("trace_regions.rs")
        .lines()
        .position(|l| l.contains("named_scope(\"a \\\"quoted"))
        .expect("line") as u32
        + 1;
    assert_eq!(e.location.expect("location").line, line, "{e}");
}
