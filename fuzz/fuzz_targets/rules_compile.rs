//! See `recast::fuzzing::rules_compile`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    recast::fuzzing::rules_compile(data);
});
