//! Snapshot of every example's Mosaic module (printed after melior's `verify()`).
//! Update intentionally changed output with `INSTA_UPDATE=always cargo test --test snapshots` and review
//! the diff of `tests/snapshots/`.

mod common;

#[test]
fn every_example_matches_its_mosaic_snapshot() {
    for (name, _) in common::all_examples() {
        insta::assert_snapshot!(format!("mosaic_{name}"), common::mosaic(name));
    }
}

#[test]
fn every_example_directory_entry_is_covered() {
    // A new example must be added to tests/common/mod.rs so it is snapshotted and parity-checked.
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");
    let mut on_disk: Vec<String> = std::fs::read_dir(dir)
        .expect("examples/ exists")
        .filter_map(|e| e.ok()?.path().file_stem()?.to_str().map(str::to_string))
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = common::all_examples().map(|(n, _)| n.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed);
}
