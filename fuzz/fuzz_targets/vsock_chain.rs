//! `vsock_chain`: see `belljar_fuzz_harness::vsock_chain`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| belljar_fuzz_harness::vsock_chain::run(data));
