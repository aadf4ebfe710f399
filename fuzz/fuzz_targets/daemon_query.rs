//! `daemon_query`: see `belljar_fuzz_harness::daemon_query`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| belljar_fuzz_harness::daemon_query::run(data));
