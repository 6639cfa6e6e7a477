//! See `recast::fuzzing::upstream_answer_h2`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    recast::fuzzing::upstream_answer_h2(data);
});
