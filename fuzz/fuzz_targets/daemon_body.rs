//! `daemon_body`: see `belljar_fuzz_harness::daemon_body`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| belljar_fuzz_harness::daemon_body::run(data));
