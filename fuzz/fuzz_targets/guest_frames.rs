//! `guest_frames`: see `belljar_fuzz_harness::guest_frames`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| belljar_fuzz_harness::guest_frames::run(data));
