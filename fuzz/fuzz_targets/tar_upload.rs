//! `tar_upload`: see `belljar_fuzz_harness::tar_upload`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| belljar_fuzz_harness::tar_upload::run(data));
