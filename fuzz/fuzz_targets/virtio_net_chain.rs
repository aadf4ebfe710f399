//! `virtio_net_chain`: see `belljar_fuzz_harness::virtio_net_chain`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| belljar_fuzz_harness::virtio_net_chain::run(data));
