//! `virtio_blk_chain`: see `belljar_fuzz_harness::virtio_blk_chain`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| belljar_fuzz_harness::virtio_blk_chain::run(data));
