//! See `recast::fuzzing::caller_token`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    recast::fuzzing::caller_token(data);
});
