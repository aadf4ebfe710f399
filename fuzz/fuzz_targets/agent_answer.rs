//! `agent_answer`: see `belljar_fuzz_harness::agent_answer`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| belljar_fuzz_harness::agent_answer::run(data));
