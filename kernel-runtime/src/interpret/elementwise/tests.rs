//! The elementwise loops' destinations: offered output blocks, and results broadcast like their
//! operands.

use super::super::tensor::Dims;
use super::*;

/// A destination of `shape` in a buffer with a one-element margin on each side (row stride 6 for
/// rows of 4, so the result is strided into it).
fn dest_in(buf: &mut [f32], shape: [usize; 2], dtype: DType) -> RawDest {
    RawDest {
        ptr: buf.as_mut_ptr() as *mut u8,
        len: buf.len(),
        off: 1,
        strides: smallvec::smallvec![6, 1],
        shape: shape.into_iter().collect(),
        dtype,
    }
}

/// `iota` along dimension `dim` of `shape` as the machine makes it: a view, 0 strides elsewhere.
fn iota(shape: [usize; 2], dim: usize) -> Tensor {
    let mut strides: Dims = smallvec::smallvec![0; 2];
    strides[dim] = 1;
    let n = shape[dim] as i32;
    let buf =
        super::super::tensor::Buf::host(crate::semantics::host::HostData::I32((0..n).collect()));
    Tensor {
        dtype: DType::I32,
        shape: shape.into_iter().collect(),
        strides,
        offset: 0,
        buf,
    }
}

/// Every element of `t` (any strides), row-major.
fn elements<T: HostElement>(t: &Tensor) -> Vec<T> {
    let d = t.data::<T>().unwrap();
    let (rows, cols) = (t.shape[0], t.shape[1]);
    (0..rows * cols)
        .map(|i| d[t.offset + (i / cols) * t.strides[0] + (i % cols) * t.strides[1]])
        .collect()
}

#[test]
fn ops_on_operands_broadcast_alike_compute_once_and_stay_broadcast() {
    let fresh = Sink::fresh();
    let k_first = Tensor::scalar(300i32).broadcast_to(&[8, 256]).unwrap();
    let k_pos = binary(BinaryOp::Add, &iota([8, 256], 1), &k_first, &fresh).unwrap();
    // One row computed, broadcast over the 8 rows.
    assert_eq!(&k_pos.strides[..], &[0, 1]);
    assert_eq!(k_pos.buf.len(), 256);
    let end = Tensor::scalar(400i32).broadcast_to(&[8, 256]).unwrap();
    let keep = compare(CmpOp::Lt, &k_pos, &end, &fresh).unwrap();
    assert_eq!(&keep.strides[..], &[0, 1]);
    let want: Vec<bool> = (0..8 * 256).map(|i| 300 + (i % 256) < 400).collect();
    assert_eq!(elements::<bool>(&keep), want);
    // Rows against columns: every element is its own.
    let q_pos = binary(BinaryOp::Add, &iota([8, 256], 0), &k_first, &fresh).unwrap();
    assert_eq!(&q_pos.strides[..], &[1, 0]);
    let causal = compare(CmpOp::Le, &k_pos, &q_pos, &fresh).unwrap();
    assert!(causal.is_contiguous());
    let want: Vec<bool> = (0..8 * 256).map(|i| i % 256 <= i / 256).collect();
    assert_eq!(elements::<bool>(&causal), want);
    // A select whose operands are all broadcast alike stays broadcast too.
    let zero = Tensor::scalar(0i32).broadcast_to(&[8, 256]).unwrap();
    let picked = select(&keep, &k_pos, &zero, &fresh).unwrap();
    assert_eq!(&picked.strides[..], &[0, 1]);
    let want: Vec<i32> = (0..8 * 256)
        .map(|i| 300 + i % 256)
        .map(|p| if p < 400 { p } else { 0 })
        .collect();
    assert_eq!(elements::<i32>(&picked), want);
}

#[test]
fn an_offered_destination_receives_a_result_broadcast_alike_in_full() {
    let rows = Tensor::scalar(2.5f32).broadcast_to(&[2, 4]).unwrap();
    let mut buf = vec![-1.0f32; 14];
    let dest = dest_in(&mut buf, [2, 4], DType::F32);
    // SAFETY: `buf` outlives the sink and nothing else touches it meanwhile.
    let sink = unsafe { Sink::offer(&dest) };
    unary(UnaryOp::Neg, &rows, &sink).unwrap();
    assert!(sink.filled());
    let want = [
        -1., -2.5, -2.5, -2.5, -2.5, -1., -1., -2.5, -2.5, -2.5, -2.5, -1., -1., -1.,
    ];
    assert_eq!(buf, want);
}

#[test]
fn an_offered_destination_of_the_right_type_receives_the_result() {
    let x = Tensor::from_vec([2, 4], (0..8).map(|i| i as f32).collect::<Vec<_>>());
    let mut buf = vec![-1.0f32; 14];
    let dest = dest_in(&mut buf, [2, 4], DType::F32);
    // SAFETY: `buf` outlives the sink and nothing else touches it meanwhile.
    let sink = unsafe { Sink::offer(&dest) };
    binary(BinaryOp::Mul, &x, &x, &sink).unwrap();
    assert!(sink.filled());
    let want = [
        -1., 0., 1., 4., 9., -1., -1., 16., 25., 36., 49., -1., -1., -1.,
    ];
    assert_eq!(
        buf.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        want.map(f32::to_bits)
    );
}

#[test]
fn a_destination_of_another_type_or_shape_is_left_alone() {
    let x = Tensor::from_vec([2, 4], (0..8).map(|i| i as f32).collect::<Vec<_>>());
    let mut buf = vec![-1.0f32; 14];
    for (dtype, shape) in [(DType::BF16, [2, 4]), (DType::F32, [4, 2])] {
        let dest = dest_in(&mut buf, shape, dtype);
        // SAFETY: as above.
        let sink = unsafe { Sink::offer(&dest) };
        let t = unary(UnaryOp::Neg, &x, &sink).unwrap();
        assert!(!sink.filled());
        assert_eq!(t.data::<f32>().unwrap()[7], -7.0);
    }
    // A comparison of bf16 values casts them to f32 first: those casts must not take the
    // destination offered to the comparison's bool result.
    let b = cast(&x, DType::BF16).unwrap();
    let dest = dest_in(&mut buf, [2, 4], DType::F32);
    // SAFETY: as above.
    let sink = unsafe { Sink::offer(&dest) };
    let t = compare(CmpOp::Lt, &b, &b, &sink).unwrap();
    assert!(!sink.filled() && t.dtype == DType::Bool);
    assert!(buf.iter().all(|&v| v == -1.0));
}
