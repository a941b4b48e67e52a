//! libFuzzer entry point of the `render` target; the body is kpr_fuzz_targets::render.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kpr_fuzz_targets::render(data));
