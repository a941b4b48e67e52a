//! libFuzzer entry point of the `manifest` target; the body is kpr_fuzz_targets::manifest.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kpr_fuzz_targets::manifest(data));
