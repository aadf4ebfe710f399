//! `agent_request`: see `belljar_fuzz_harness::agent_request`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| belljar_fuzz_harness::agent_request::run(data));
