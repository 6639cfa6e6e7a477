//! See `recast::fuzzing::upstream_answer`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    recast::fuzzing::upstream_answer(data);
});
