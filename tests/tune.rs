//! `tpu_kernel::tune` (issue 25, item 2) on one example, a small space: the matmul example for v5e at
//! 2048³ bf16 over block sizes. Configurations our VMEM check refuses are pruned before any compile;
//! the rest compile in libtpu workers (no Python) and are ranked by the static cost model; the best is
//! cached per generation and a second run is answered from the cache with no compile.

mod common;

use tpu_kernel::prelude::*;
use tpu_kernel::tune::{copies, powers_of_two, tune, Copies, Options, Outcome, Space};
use tpu_kernel::{ArrayType, Target};

fn space() -> Space {
    Space::new()
        .param("bm", [256, 2048])
        .param("bn", powers_of_two(256, 512))
        .param("bk", [256, 2048])
        .constraint("bn <= bm", |c| c["bn"] <= c["bm"])
}

#[test]
fn matmul_block_sizes_are_pruned_compiled_ranked_and_cached() {
    let dir = std::env::temp_dir().join(format!("tpu-kernel-tune-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let options = Options {
        workers: 2,
        cache_dir: Some(dir.clone()),
        ..Options::default()
    };
    let a = ArrayType::new([2048, 2048], BF16);
    let build = |c: &tpu_kernel::tune::Config| {
        common::matmul::matmul(
            a.clone(),
            a.clone(),
            (c["bm"] as usize, c["bn"] as usize, c["bk"] as usize),
        )
    };
    let t =
        tune("matmul", Target::V5e, &space(), &options, build).unwrap_or_else(|e| panic!("{e}"));
    println!("{}", t.report());
    // 2 × 2 × 2 = 8, minus bn=512 > bm=256 (2 configurations)
    assert_eq!(t.constrained_out, 2);
    assert_eq!(t.outcomes.len(), 6);
    // bm = bk = 2048: x's double-buffered 2048² bf16 block alone is 16 MiB, v5e's default scoped VMEM
    let pruned: Vec<_> = t
        .outcomes
        .iter()
        .filter_map(|(c, o)| match o {
            Outcome::Pruned(why) => Some((c, why)),
            _ => None,
        })
        .collect();
    assert_eq!(pruned.len(), 2, "{}", t.report());
    for (c, why) in &pruned {
        assert!(c["bm"] == 2048 && c["bk"] == 2048, "{c}");
        assert!(why.contains("VMEM"), "{why}");
    }
    // only the others were compiled
    assert_eq!(t.compiles, 4);
    let ranked: Vec<_> = t.ranked().collect();
    assert_eq!(ranked.len(), 4, "{}", t.report());
    assert!(ranked.windows(2).all(|w| w[0].1.cycles <= w[1].1.cycles));
    assert_eq!(ranked[0].0, &t.best);
    assert_eq!(ranked[0].1.cycles, t.best_cycles);
    for (c, e) in &ranked {
        // the grid is what the blocks make of 2048³
        let steps = (2048 / c["bm"]) * (2048 / c["bn"]) * (2048 / c["bk"]);
        assert_eq!(e.steps, steps as u64, "{c}");
        assert!(e.body > 0 && e.cycles > 0.0, "{c}: {e:?}");
        // the pipeline skips a block whose index repeats: the output's over the reduction axis
        // when it has more than one step, x's over the column axis when it has one (the model
        // takes both from the kernel's index maps)
        let every_step = e.dma_step * e.steps as f64;
        assert!(
            e.dma_grid < every_step && e.dma_grid >= e.dma_step,
            "{c}: {e:?}"
        );
    }
    // 256³ blocks take 512 steps of a small body: the model ranks it below the larger blocks
    let small = ranked
        .iter()
        .find(|(c, _)| c["bm"] == 256 && c["bk"] == 256)
        .unwrap();
    assert!(small.1.cycles > t.best_cycles, "{}", t.report());

    // cached: the same key is answered without a build's compile
    let again = tune("matmul", Target::V5e, &space(), &options, build).unwrap();
    assert!(again.from_cache && again.compiles == 0, "{again:?}");
    assert_eq!(again.best, t.best);
    assert_eq!(again.key, t.key);
    let file = std::fs::read_to_string(dir.join("v5e.json")).unwrap();
    assert!(
        file.contains("\"best\"") && file.contains(&t.key.replace('"', "\\\"")),
        "{file}"
    );
    // another generation is another file and another tuning
    let v6e = tune("matmul", Target::V6e, &space(), &options, build).unwrap();
    assert!(!v6e.from_cache && v6e.compiles > 0);
    assert!(dir.join("v6e.json").is_file());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_copy_pattern_follows_the_index_maps() {
    // 1024² bf16 in 512³ blocks, a (2, 2, 2) grid: x and y move every step, the output block only
    // when (i, j) changes — what python/tests/test_tune.py reads from the same kernel's Mosaic
    let a = ArrayType::new([1024, 1024], BF16);
    let call = common::matmul::matmul(a.clone(), a.clone(), (512, 512, 512)).unwrap();
    assert_eq!(copies(&call), Some(Copies(vec![(4, 2.0 / 3.0), (3, 1.0)])));
    // one block of each: one step, nothing after it
    let one = common::matmul::matmul(a.clone(), a, (1024, 1024, 1024)).unwrap();
    assert_eq!(copies(&one), Some(Copies(vec![])));
}

#[test]
fn an_empty_space_and_an_unbuildable_space_are_errors() {
    let options = Options {
        cache_dir: None,
        progress: false,
        ..Options::default()
    };
    let empty = Space::new()
        .param("b", [1, 2])
        .constraint("b > 2", |c| c["b"] > 2);
    let a = ArrayType::new([512, 512], BF16);
    let e = tune("matmul", Target::V5e, &empty, &options, |_| {
        common::matmul::matmul(a.clone(), a.clone(), (128, 128, 128))
    })
    .unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
    let odd = Space::new().param("b", [100, 300]);
    let e = tune("matmul", Target::V5e, &odd, &options, |c| {
        let b = c["b"] as usize;
        common::matmul::matmul(a.clone(), a.clone(), (b, b, b))
    })
    .unwrap_err();
    assert!(e.to_string().contains("no configuration"), "{e}");
}
