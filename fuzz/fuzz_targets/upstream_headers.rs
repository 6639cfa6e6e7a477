//! See `recast::fuzzing::upstream_headers`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    recast::fuzzing::upstream_headers(data);
});
