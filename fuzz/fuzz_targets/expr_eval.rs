//! See `recast::fuzzing::expr_eval`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    recast::fuzzing::expr_eval(data);
});
