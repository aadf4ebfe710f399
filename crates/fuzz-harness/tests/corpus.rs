//! Replays every committed corpus file of every fuzz target through its harness, so that
//! `cargo test` (and CI, which runs no fuzzer) fails when a once-fixed crash comes back or a
//! target stops accepting its own corpus.

use std::path::Path;

#[test]
fn every_corpus_file_replays_without_a_crash() {
    let corpora = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    let mut total = 0;
    for (name, run) in belljar_fuzz_harness::TARGETS {
        let dir = corpora.join(name);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|d| d.unwrap().path())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "{name} has no corpus");
        for file in files {
            let data = std::fs::read(&file).unwrap();
            eprintln!("{name}: {}", file.display());
            run(&data);
            total += 1;
        }
    }
    belljar_fuzz_harness::remove_scratch();
    assert!(total >= belljar_fuzz_harness::TARGETS.len());
}
